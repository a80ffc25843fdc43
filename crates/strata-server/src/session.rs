//! One client's session: who it is, where it connects from, what it has selected, queued
//! or watched, and the writes whose replies are not sent yet. The connection loop
//! (`conn`) owns it; commands (`cmd`) read and change it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::Ticket;

use crate::auth::Role;
use crate::watch::Watched;

/// Most SCAN cursors a connection keeps.
const SCAN_CURSORS_MAX: usize = 64;

/// Where a client is connected from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Peer {
    /// A TCP (or TLS) client at `remote`, connected to this server's `local` address.
    Tcp {
        remote: SocketAddr,
        local: SocketAddr,
    },
    /// A client of the Unix socket at this path (on this machine).
    Unix(Arc<str>),
}

impl Peer {
    /// A TCP client at `remote` on `sock` (its local address unknown if the socket
    /// cannot tell: the unspecified address).
    pub(crate) fn tcp(sock: &tokio::net::TcpStream, remote: SocketAddr) -> Peer {
        let local = sock
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        Peer::Tcp { remote, local }
    }

    /// The address failed `AUTH` attempts are counted under; a Unix socket's clients count
    /// as loopback clients.
    pub(crate) fn ip(&self) -> IpAddr {
        match self {
            Peer::Tcp { remote, .. } => remote.ip(),
            Peer::Unix(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// Whether the client is on this machine (protected mode admits only those).
    pub(crate) fn is_local(&self) -> bool {
        match self {
            Peer::Tcp { remote, .. } => crate::auth::is_loopback_client(remote),
            Peer::Unix(_) => true,
        }
    }
}

/// As Redis shows it in `CLIENT LIST` (`127.0.0.1:50000`, `/run/strata.sock:0`).
impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp { remote, .. } => write!(f, "{remote}"),
            Peer::Unix(path) => write!(f, "{path}:0"),
        }
    }
}

impl Peer {
    /// The server's end of the connection, as `CLIENT LIST` shows it in `laddr` (a Unix
    /// socket's clients: the socket's path, as their `addr`).
    pub(crate) fn local(&self) -> String {
        match self {
            Peer::Tcp { local, .. } => local.to_string(),
            Peer::Unix(path) => format!("{path}:0"),
        }
    }
}

/// Per-connection state the commands see.
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) peer: Peer,
    pub(crate) proto: u8,
    /// The authenticated user and role; `None` until `AUTH` when a password is required.
    pub(crate) user: Option<(String, Role)>,
    pub(crate) name: String,
    /// The selected database.
    pub(crate) db: u8,
    pub(crate) multi: Option<Vec<Vec<Bytes>>>,
    /// Bytes of the commands in `multi`.
    pub(crate) multi_bytes: usize,
    /// A command queued in `MULTI` was refused: `EXEC` must fail with `EXECABORT`.
    pub(crate) multi_failed: bool,
    /// While `EXEC` runs, how many commands it runs (`CLIENT LIST` shows them as Redis
    /// does: `multi=n cmd=exec`).
    pub(crate) exec_commands: Option<usize>,
    /// In cluster mode, the slot the commands queued in `MULTI` name.
    pub(crate) multi_slot: Option<u16>,
    /// The client sent `ASKING`: its next command may use a slot moving here.
    pub(crate) asking: bool,
    pub(crate) watched: Watched,
    pub(crate) scan_cursors: HashMap<u64, Bytes>,
    pub(crate) next_cursor: u64,
    pub(crate) quit: bool,
    /// What the writes whose replies are not sent yet wait for: the replies leave only once
    /// it is durable (`conn::write_out`), so a pipeline's writes share one sync.
    pub(crate) pending: Ticket,
    /// Shared with the client list: the last command's table index plus one.
    pub(crate) last_cmd: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The command running is a blocking one, run outside the server's gate (not inside
    /// `MULTI`): it may wait, taking the gate for each attempt.
    pub(crate) may_block: bool,
    /// Ends a blocking command from outside (the client left, `CLIENT UNBLOCK`); shared
    /// with the client list.
    pub(crate) unblock: std::sync::Arc<crate::blocked::Unblock>,
    /// When the command before ran to its end, if the next one follows it at once (in one
    /// pipeline, nothing waited on between): the next one's timing starts there, one clock
    /// read per command instead of two.
    pub(crate) lap: Option<crate::stopwatch::Tick>,
    /// Its calls not yet in the server's counters.
    pub(crate) tally: crate::metrics::Tally,
}

impl Conn {
    /// A new session; `open`: no password is set, so it starts authenticated.
    pub(crate) fn new(id: u64, peer: Peer, open: bool) -> Conn {
        Conn {
            id,
            peer,
            proto: 2,
            user: open.then(|| ("default".to_string(), Role::Admin)),
            name: String::new(),
            db: 0,
            multi: None,
            exec_commands: None,
            multi_bytes: 0,
            multi_failed: false,
            multi_slot: None,
            asking: false,
            watched: Watched::default(),
            scan_cursors: HashMap::new(),
            next_cursor: 1,
            may_block: false,
            unblock: Default::default(),
            lap: None,
            tally: Default::default(),
            quit: false,
            pending: Ticket::NONE,
            last_cmd: Default::default(),
        }
    }

    /// Remembers where a scan stopped and returns the cursor number for it.
    pub(crate) fn save_cursor(&mut self, next: Bytes) -> u64 {
        if self.scan_cursors.len() >= SCAN_CURSORS_MAX {
            if let Some(&oldest) = self.scan_cursors.keys().min() {
                self.scan_cursors.remove(&oldest);
            }
        }
        let c = self.next_cursor;
        self.next_cursor += 1;
        self.scan_cursors.insert(c, next);
        c
    }
}
