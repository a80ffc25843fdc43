//! One client connection: read, parse, run, reply, with limits on everything buffered.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use strata_engine::Ticket;
use strata_resp::{Limits, Reply, ReplyBuf, RequestReader, Requests};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::session::{Conn, Peer};
use crate::shared::{ClientEntry, Shared};

/// Replies are written once this many bytes are pending, even mid-pipeline.
const FLUSH_BYTES: usize = 1 << 20;
/// Most requests parsed before running them.
const BATCH_COUNT_MAX: usize = 1024;
/// With other clients connected, one turn runs at most about this many bytes of a client's
/// requests before the others get theirs (Redis reads 16 KiB of a client per turn of its
/// event loop): a pipelined writer holds up a reader's `GET` by a turn, not a pipeline.
const TURN_BYTES: usize = 16 << 10;

/// Writes the pending replies. A client that leaves them unread for `stall` (when not zero)
/// is cut off: its replies are the only memory it can pin, and only for that long.
/// First, the writes whose replies are among them must be durable (`pending`: the ticket
/// that covers them all); if that sync fails, nothing is sent and the connection closes,
/// so none of them is acknowledged.
async fn write_out<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &mut ReplyBuf,
    shared: &Shared,
    pending: &mut Ticket,
) -> std::io::Result<()> {
    if !pending.is_none() {
        if let Err(e) = shared.engine.wait(*pending).await {
            tracing::error!(error = %e, "writes not made durable; closing the connection without acknowledging them");
            return Err(std::io::Error::other(e.to_string()));
        }
        *pending = Ticket::NONE;
    }
    let stall = Duration::from_secs(shared.cfg.read().client_write_timeout_secs);
    for chunk in out.take_chunks() {
        // Most replies fit the socket's buffer: written at once, with no timer to arm.
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            match wr.write(rest).now_or_never() {
                Some(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Some(Ok(n)) => rest = &rest[n..],
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        if rest.is_empty() {
            continue;
        }
        if stall.is_zero() {
            wr.write_all(rest).await?;
        } else if tokio::time::timeout(stall, wr.write_all(rest))
            .await
            .is_err()
        {
            shared
                .counters
                .clients_cut_off_not_reading
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!("client left its replies unread for {stall:?}; closing connection");
            return Err(std::io::ErrorKind::TimedOut.into());
        }
    }
    Ok(())
}

/// The protected-mode refusal (Redis's wording, so operators recognise it).
const DENIED: &[u8] = b"-DENIED Strata is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Strata you may set a password (requirepass or users) or disable protected mode with CONFIG SET protected-mode no from the loopback interface.\r\n";

/// What parsing one turn's requests ([`take_turn`]) found beside them.
struct Turn {
    /// What ended parsing early, if the buffer held a malformed request.
    protocol_error: Option<strata_resp::ProtocolError>,
    /// Requests may be left in the buffer (the batch is full, or the turn ended).
    more_buffered: bool,
    /// The turn ended at [`TURN_BYTES`] with bytes left in the buffer (only with other
    /// clients connected: `shares`).
    turn_ended: bool,
}

/// Parses the requests of one turn of a connection into `batch` (emptied first).
fn take_turn(
    reader: &mut RequestReader,
    inbuf: &mut BytesMut,
    limits: &Limits,
    shares: bool,
    batch: &mut Requests,
) -> Turn {
    batch.clear();
    let bytes_max = if shares { TURN_BYTES } else { usize::MAX };
    let protocol_error = reader
        .read_turn(inbuf, limits, BATCH_COUNT_MAX, bytes_max, batch)
        .err();
    let turn_ended =
        protocol_error.is_none() && shares && batch.bytes() >= TURN_BYTES && !inbuf.is_empty();
    Turn {
        more_buffered: protocol_error.is_none() && (batch.len() == BATCH_COUNT_MAX || turn_ended),
        protocol_error,
        turn_ended,
    }
}

/// Serves one client on `sock` (plain TCP, TLS or a Unix socket) until it leaves, is
/// killed, idles out, or the server shuts down.
pub(crate) async fn handle<S>(shared: Arc<Shared>, sock: S, peer: Peer)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    shared
        .counters
        .total_connections_received
        .fetch_add(1, Ordering::Relaxed);
    let (rd, mut wr) = tokio::io::split(sock);
    let Some(admitted) = admit(&shared, &peer, &mut wr).await else {
        return;
    };
    let mut client = Client::new(shared, rd, wr, peer, admitted);
    client.serve().await;
    client.leave();
}

/// What the client list shares with a connection it admitted.
struct Admitted {
    id: u64,
    killed: Arc<AtomicBool>,
    last_cmd: Arc<AtomicUsize>,
    kill_wake: Arc<tokio::sync::Notify>,
    unblock: Arc<crate::blocked::Unblock>,
}

/// Admits a client into the client list, or refuses it (protected mode, `maxclients`) with
/// Redis's error on `wr`.
async fn admit<W: AsyncWrite + Unpin>(
    shared: &Shared,
    peer: &Peer,
    wr: &mut W,
) -> Option<Admitted> {
    let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let denied = {
        let cfg = shared.cfg.read();
        cfg.protected_mode && cfg.is_open() && !peer.is_local()
    };
    if denied {
        shared
            .counters
            .protected_mode_denied
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, "protected mode: refused a client from outside the loopback interface");
        let _ = wr.write_all(DENIED).await;
        let _ = wr.shutdown().await;
        return None;
    }
    let admitted = Admitted {
        id,
        killed: Arc::new(AtomicBool::new(false)),
        last_cmd: Arc::new(AtomicUsize::new(0)),
        kill_wake: Arc::new(tokio::sync::Notify::new()),
        unblock: Arc::new(crate::blocked::Unblock::default()),
    };
    if !list_client(shared, peer, &admitted) {
        shared
            .counters
            .rejected_connections
            .fetch_add(1, Ordering::Relaxed);
        let _ = wr
            .write_all(b"-ERR max number of clients reached\r\n")
            .await;
        return None;
    }
    Some(admitted)
}

/// Adds the client to the client list, unless `maxclients` are there.
fn list_client(shared: &Shared, peer: &Peer, a: &Admitted) -> bool {
    let maxclients = shared.cfg.read().maxclients as usize;
    let mut clients = shared.clients.lock();
    if clients.len() >= maxclients {
        return false;
    }
    clients.insert(
        a.id,
        ClientEntry {
            peer: peer.clone(),
            name: String::new(),
            user: "default".to_string(),
            db: 0,
            proto: 2,
            created: Instant::now(),
            last_cmd: Arc::clone(&a.last_cmd),
            killed: Arc::clone(&a.killed),
            kill_wake: Arc::clone(&a.kill_wake),
            unblock: Arc::clone(&a.unblock),
        },
    );
    shared.clients_open.store(clients.len(), Ordering::Relaxed);
    true
}

/// The settings a connection reads once per round (`CONFIG SET` applies from the next).
struct LiveLimits {
    limits: Limits,
    query_limit: usize,
    request_timeout: Duration,
}

impl LiveLimits {
    fn read(shared: &Shared) -> LiveLimits {
        let cfg = shared.cfg.read();
        LiveLimits {
            limits: Limits {
                bulk_bytes_max: cfg.proto_max_bulk_len as usize,
                ..Limits::default()
            },
            query_limit: cfg.client_query_buffer_limit as usize,
            request_timeout: Duration::from_secs(cfg.client_request_timeout_secs),
        }
    }
}

/// What a connection's loop does after a turn.
enum Next {
    /// Parse and run again without reading (requests are buffered, or the others had
    /// their turn).
    Again,
    /// Read from the socket.
    Read,
    /// Close the connection.
    Close,
}

/// One connection's state: its halves, buffers, and where its requests stand.
struct Client<S> {
    shared: Arc<Shared>,
    conn: Conn,
    rd: ReadHalf<S>,
    wr: WriteHalf<S>,
    inbuf: BytesMut,
    reader: RequestReader,
    batch: Requests,
    out: ReplyBuf,
    killed: Arc<AtomicBool>,
    kill_wake: Arc<tokio::sync::Notify>,
    stop: tokio::sync::watch::Receiver<bool>,
    last_activity: Instant,
    /// When the first byte of a request that has not fully arrived was read.
    partial_since: Option<Instant>,
    /// The idle limit and a partial request's deadline are checked on this once-a-second
    /// tick (one timer for the connection's life, not one per request).
    tick: tokio::time::Interval,
}

impl<S: AsyncRead + AsyncWrite> Client<S> {
    fn new(
        shared: Arc<Shared>,
        rd: ReadHalf<S>,
        wr: WriteHalf<S>,
        peer: Peer,
        a: Admitted,
    ) -> Self {
        let open = shared.cfg.read().is_open();
        let mut conn = Conn::new(a.id, peer, open);
        conn.last_cmd = a.last_cmd;
        conn.unblock = a.unblock;
        let stop = shared.shutdown.subscribe();
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Client {
            shared,
            conn,
            rd,
            wr,
            inbuf: BytesMut::with_capacity(16 << 10),
            reader: RequestReader::default(),
            batch: Requests::default(),
            out: ReplyBuf::new(2),
            killed: a.killed,
            kill_wake: a.kill_wake,
            stop,
            last_activity: Instant::now(),
            partial_since: None,
            tick,
        }
    }

    /// Reads, runs and replies until the connection ends.
    async fn serve(&mut self) {
        loop {
            let live = LiveLimits::read(&self.shared);
            match self.turn(&live).await {
                Next::Again => continue,
                Next::Close => return,
                Next::Read => {}
            }
            if self.over_limits(&live).await {
                return;
            }
            self.make_room();
            if !self.read_more().await {
                return;
            }
        }
    }

    /// Parses and runs one turn's requests and sends their replies.
    async fn turn(&mut self, live: &LiveLimits) -> Next {
        let shares = self.shared.clients_open.load(Ordering::Relaxed) > 1;
        let Turn {
            protocol_error,
            more_buffered,
            turn_ended,
        } = take_turn(
            &mut self.reader,
            &mut self.inbuf,
            &live.limits,
            shares,
            &mut self.batch,
        );
        if !self.batch.is_empty() {
            // A request arrived whole: the clock restarts for the next one.
            self.partial_since = None;
            if self.run_turn(live.query_limit).await.is_err() {
                return Next::Close;
            }
        }
        // The arguments go now (their vector stays): held while the connection waits, they
        // would keep the read buffer's memory from its next requests.
        self.batch.clear();
        if let Some(e) = protocol_error {
            self.shared
                .counters
                .clients_cut_off_protocol_error
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(client = self.conn.id, peer = %self.conn.peer, error = %e, "protocol error; closing connection");
            self.close_with(Reply::Error(format!("ERR {e}"))).await;
            return Next::Close;
        }
        if turn_ended && self.out.len() < FLUSH_BYTES && !self.ending() {
            // The others' turn; these replies leave with the next turn's.
            tokio::task::yield_now().await;
            return Next::Again;
        }
        if self.reply().await.is_err() || self.ending() {
            return Next::Close;
        }
        match more_buffered {
            true => Next::Again,
            false => Next::Read,
        }
    }

    /// Runs the parsed requests of this turn.
    async fn run_turn(&mut self, query_limit: usize) -> std::io::Result<()> {
        let io = Io {
            rd: &mut self.rd,
            inbuf: &mut self.inbuf,
            query_limit,
            kill_wake: &self.kill_wake,
            wr: &mut self.wr,
        };
        run_batch(&self.shared, &mut self.conn, &self.batch, &mut self.out, io).await
    }

    /// Sends the pending replies, if any.
    async fn reply(&mut self) -> std::io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        if self.shared.clients_open.load(Ordering::Relaxed) > 1 {
            // Other connections' requests that arrived with this one run before the replies
            // go out, so replies leave in a burst, as Redis writes them before it sleeps.
            // A lone client has no one to wait for: the turn through the scheduler (which
            // polls the I/O driver once more) cost it 3-6% of its requests per second.
            tokio::task::yield_now().await;
        }
        write_out(
            &mut self.wr,
            &mut self.out,
            &self.shared,
            &mut self.conn.pending,
        )
        .await
    }

    /// The client asked to quit, or was killed.
    fn ending(&self) -> bool {
        self.conn.quit || self.killed.load(Ordering::Acquire)
    }

    /// Sends `reply` after those pending, before the connection closes.
    async fn close_with(&mut self, reply: Reply) {
        self.out.push(&reply);
        let _ = write_out(
            &mut self.wr,
            &mut self.out,
            &self.shared,
            &mut self.conn.pending,
        )
        .await;
    }

    /// Whether the client passed the query buffer's limit or the request deadline; it is
    /// told so, and the connection closes.
    async fn over_limits(&mut self, live: &LiveLimits) -> bool {
        if self.inbuf.len() + self.reader.held_bytes() > live.query_limit {
            self.close_with(Reply::err(
                "ERR query buffer limit exceeded; closing connection",
            ))
            .await;
            return true;
        }
        self.partial_since = if self.inbuf.is_empty() && !self.reader.is_pending() {
            None
        } else {
            Some(self.partial_since.unwrap_or_else(Instant::now))
        };
        let timeout = live.request_timeout;
        match self.partial_since {
            Some(t) if !timeout.is_zero() && t.elapsed() >= timeout => {
                self.shared
                    .counters
                    .clients_cut_off_slow_request
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(client = self.conn.id, peer = %self.conn.peer, "request not completed in {timeout:?}; closing connection");
                self.close_with(Reply::Error(format!(
                    "ERR request not completed within {} seconds; closing connection",
                    timeout.as_secs()
                )))
                .await;
                true
            }
            _ => false,
        }
    }

    /// Makes room in the read buffer for what comes next.
    fn make_room(&mut self) {
        let spare = self.inbuf.capacity() - self.inbuf.len();
        if self.reader.wanted() > spare {
            // A large argument is arriving: room for exactly the rest of it, so it is read
            // in place (the request's other arguments are held apart by the reader, so only
            // this argument's first bytes move). Its size passed the bulk limit.
            self.inbuf.reserve(self.reader.wanted());
        } else if spare < 8 << 10 {
            // Grow by at least what is buffered; the query buffer limit above bounds it.
            self.inbuf.reserve((64 << 10).max(self.inbuf.len()));
        }
    }

    /// Waits for more bytes from the client; `false` when the connection ends instead (the
    /// client left, was killed or idled out, or the server stops).
    async fn read_more(&mut self) -> bool {
        tokio::select! {
            r = self.rd.read_buf(&mut self.inbuf) => match r {
                Ok(0) | Err(_) => false,
                Ok(_) => {
                    self.last_activity = Instant::now();
                    true
                }
            },
            _ = self.stop.changed() => false,
            _ = self.kill_wake.notified() => false,
            // The idle limit can change live (CONFIG SET timeout), so check it every second;
            // the request deadline is checked before each read.
            _ = self.tick.tick() => {
                let idle = self.shared.cfg.read().timeout_secs;
                let idled = idle > 0 && self.last_activity.elapsed() >= Duration::from_secs(idle);
                if idled {
                    tracing::debug!(client = self.conn.id, "idle timeout");
                }
                !idled
            }
        }
    }

    /// Takes the connection out of the server's books.
    fn leave(mut self) {
        crate::cmd::flush_tally(&self.shared, &mut self.conn);
        self.shared.watches.unwatch(&mut self.conn.watched);
        self.shared.engine.end_stream(self.conn.id);
        let mut clients = self.shared.clients.lock();
        clients.remove(&self.conn.id);
        self.shared
            .clients_open
            .store(clients.len(), Ordering::Relaxed);
    }
}

/// Takes the gate for reading, or, while a script runs past the busy threshold, answers
/// the `-BUSY` error instead.
async fn gate_read(shared: &Shared) -> Result<tokio::sync::RwLockReadGuard<'_, ()>, Reply> {
    match shared.gate.try_read() {
        Ok(g) => Ok(g),
        Err(_) => unless_busy(shared, || shared.gate.read()).await,
    }
}

/// [`gate_read`] for writing (commands that run alone).
async fn gate_write(shared: &Shared) -> Result<tokio::sync::RwLockWriteGuard<'_, ()>, Reply> {
    match shared.gate.try_write() {
        Ok(g) => Ok(g),
        Err(_) => unless_busy(shared, || shared.gate.write()).await,
    }
}

/// Waits for what `acquire` gives (the gate), or answers `-BUSY` once a script is busy: a
/// client already waiting is woken when the script turns busy.
async fn unless_busy<G, F: std::future::Future<Output = G>>(
    shared: &Shared,
    acquire: impl Fn() -> F,
) -> Result<G, Reply> {
    loop {
        let turned_busy = shared.script_busy.notified();
        tokio::pin!(turned_busy);
        turned_busy.as_mut().enable();
        if let Some(busy) = shared.script.busy_error() {
            return Err(busy);
        }
        tokio::select! {
            g = acquire() => return Ok(g),
            _ = &mut turned_busy => {}
        }
    }
}

/// What a command refused by a busy script answers: the few commands that stop or watch
/// the script run beside it, without the gate; every other gets `-BUSY`.
async fn beside_busy_script(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    args: &[Bytes],
    idx: Option<usize>,
    busy: Reply,
) -> Reply {
    if crate::cmd::scripting::runs_while_busy(args) {
        return crate::cmd::execute(shared, conn, args, idx).await;
    }
    // As in Redis, a refusal inside `MULTI` fails the transaction, and a refused `EXEC`
    // ends it with the reason.
    if conn.multi.is_some() {
        if args[0].eq_ignore_ascii_case(b"exec") {
            return crate::cmd::txn::abort(shared, conn, &busy);
        }
        conn.multi_failed = true;
    }
    busy
}

/// Waits, without the gate, until the clients blocked on the keys of `requests` that a
/// change woke have tried ([`crate::blocked::Blocked::served`]); at once when none was
/// woken on them.
async fn after_woken<G>(
    shared: &Shared,
    conn: &mut Conn,
    requests: &[&[Bytes]],
    read_guard: &mut Option<G>,
) {
    let keys: Vec<_> = requests
        .iter()
        .flat_map(|a| crate::cmd::stored_keys(shared, conn, crate::cmd::lookup_request(a), a))
        .collect();
    if shared.blocked.woken_on(&keys, u64::MAX) {
        // A woken client's try takes the gate: never wait for it holding the gate.
        *read_guard = None;
        conn.lap = None;
        shared.blocked.served(&keys).await;
    }
}

/// The connection's halves and buffers, as [`run_batch`] needs them.
struct Io<'a, S> {
    rd: &'a mut ReadHalf<S>,
    inbuf: &'a mut BytesMut,
    query_limit: usize,
    kill_wake: &'a tokio::sync::Notify,
    wr: &'a mut WriteHalf<S>,
}

/// Runs a turn's requests in order: consecutive plain `SET`s, `GET`s and counters as one
/// engine call ([`crate::cmd::run_kind`]), each other on its own, the replies into `out`.
async fn run_batch<S: AsyncRead + AsyncWrite>(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    batch: &Requests,
    out: &mut ReplyBuf,
    mut io: Io<'_, S>,
) -> std::io::Result<()> {
    let mut running = Running {
        shared,
        gate: None,
        last_cmd: None,
    };
    // Commands are timed from the end of the one before only while nothing is waited on
    // between them: whatever waits (the gate, a write, a blocking command) starts over.
    conn.lap = None;
    let mut next = 0;
    let mut run: Vec<&[Bytes]> = Vec::new();
    let mut replies = Vec::new();
    while next < batch.len() {
        let args = batch.get(next);
        next += 1;
        match crate::cmd::run_kind(args, conn) {
            Some(kind) if joins(batch, next, kind, conn) => {
                run.push(args);
                extend_run(batch, &mut next, kind, conn, &mut run);
                if !running
                    .run_joined(conn, kind, &mut run, &mut replies, out)
                    .await
                {
                    continue;
                }
            }
            _ => running.run_one(conn, args, out, &mut io).await?,
        }
        if out.len() >= FLUSH_BYTES {
            // Never wait on a slow client while holding the gate.
            running.gate = None;
            crate::cmd::flush_tally(shared, conn);
            write_out(io.wr, out, shared, &mut conn.pending).await?;
            conn.lap = None;
        }
        if conn.quit {
            break;
        }
    }
    let last_cmd = running.last_cmd.take();
    drop(running);
    crate::cmd::flush_tally(shared, conn);
    // Clients these commands woke from a blocking pop try before the replies go (as in
    // Redis, where they are served first).
    shared.blocked.settled().await;
    if let Some(i) = last_cmd.and_then(|n| crate::cmd::lookup(&n)) {
        conn.last_cmd.store(i + 1, Ordering::Relaxed);
    }
    Ok(())
}

/// Whether the request at `next` joins a run of `kind`.
fn joins(batch: &Requests, next: usize, kind: crate::cmd::RunKind, conn: &Conn) -> bool {
    next < batch.len() && crate::cmd::run_kind(batch.get(next), conn) == Some(kind)
}

/// Adds the requests after `next` that join the run of `kind` in `run`, within its limits
/// of commands and bytes.
fn extend_run<'b>(
    batch: &'b Requests,
    next: &mut usize,
    kind: crate::cmd::RunKind,
    conn: &Conn,
    run: &mut Vec<&'b [Bytes]>,
) {
    let bytes_of = |a: &[Bytes]| a.iter().map(|x| x.len()).sum::<usize>();
    let mut bytes: usize = run.iter().map(|a| bytes_of(a)).sum();
    while run.len() < crate::cmd::RUN_MAX
        && bytes < crate::cmd::RUN_BYTES_MAX
        && joins(batch, *next, kind, conn)
    {
        let a = batch.get(*next);
        *next += 1;
        bytes += bytes_of(a);
        run.push(a);
    }
}

/// What a turn's commands share while they run.
struct Running<'a> {
    shared: &'a Arc<Shared>,
    /// The gate, held for reading from command to command until one may wait.
    gate: Option<tokio::sync::RwLockReadGuard<'a, ()>>,
    /// The name of the last command run, for `CLIENT LIST`.
    last_cmd: Option<Bytes>,
}

impl Running<'_> {
    /// Runs consecutive writes (or reads) of one kind together: one batch, one log record.
    /// `false`: a busy script refused them all.
    async fn run_joined(
        &mut self,
        conn: &mut Conn,
        kind: crate::cmd::RunKind,
        run: &mut Vec<&[Bytes]>,
        replies: &mut Vec<Reply>,
        out: &mut ReplyBuf,
    ) -> bool {
        let shared = self.shared;
        if shared.blocked.any_woken() {
            after_woken(shared, conn, run, &mut self.gate).await;
        }
        if let Err(busy) = self.hold_gate(conn, false).await {
            out.set_proto(conn.proto);
            for _ in run.drain(..) {
                out.push(&busy);
            }
            return false;
        }
        self.last_cmd = run.last().map(|a| a[0].clone());
        crate::cmd::execute_run(shared, conn, kind, run, replies).await;
        conn.lap = None;
        run.clear();
        out.set_proto(conn.proto);
        for r in replies.drain(..) {
            out.push(&r);
        }
        true
    }

    /// Takes the gate for reading if it is not held (with `lap`, restarting the command's
    /// clock when it waits), or hands back the `-BUSY` of a busy script.
    async fn hold_gate(&mut self, conn: &mut Conn, lap: bool) -> Result<(), Reply> {
        if self.gate.is_none() {
            if lap {
                conn.lap = None;
            }
            self.gate = Some(gate_read(self.shared).await?);
        }
        Ok(())
    }

    /// Runs one command that is not part of a run.
    async fn run_one<S: AsyncRead + AsyncWrite>(
        &mut self,
        conn: &mut Conn,
        args: &[Bytes],
        out: &mut ReplyBuf,
        io: &mut Io<'_, S>,
    ) -> std::io::Result<()> {
        let shared = self.shared;
        let idx = crate::cmd::lookup_request(args);
        let blocking = crate::cmd::is_blocking(idx, conn);
        // (A blocking command waits for its turn once it is blocked.)
        if !blocking && shared.blocked.any_woken() {
            after_woken(shared, conn, &[args], &mut self.gate).await;
        }
        let reply = if blocking {
            self.run_blocking(conn, args, idx, out, io).await?
        } else if crate::cmd::is_exclusive(idx, conn) {
            self.gate = None;
            conn.lap = None;
            match gate_write(shared).await {
                Ok(_w) => crate::cmd::execute(shared, conn, args, idx).await,
                Err(busy) => beside_busy_script(shared, conn, args, idx, busy).await,
            }
        } else {
            let busy = self.hold_gate(conn, true).await.err();
            self.last_cmd = args.first().cloned();
            match busy {
                None => crate::cmd::execute(shared, conn, args, idx).await,
                Some(b) => beside_busy_script(shared, conn, args, idx, b).await,
            }
        };
        out.set_proto(conn.proto);
        out.push(&reply);
        Ok(())
    }

    /// Runs a command that may wait for another client: the replies before it leave now,
    /// and it runs without the gate (it takes it for each attempt). While it waits, the
    /// socket is watched for the client leaving (what it sends meanwhile is kept for later,
    /// within the query buffer's limit).
    async fn run_blocking<S: AsyncRead + AsyncWrite>(
        &mut self,
        conn: &mut Conn,
        args: &[Bytes],
        idx: Option<usize>,
        out: &mut ReplyBuf,
        io: &mut Io<'_, S>,
    ) -> std::io::Result<Reply> {
        let shared = self.shared;
        self.gate = None;
        conn.lap = None;
        crate::cmd::flush_tally(shared, conn);
        if !out.is_empty() {
            write_out(io.wr, out, shared, &mut conn.pending).await?;
        }
        self.last_cmd = args.first().cloned();
        conn.may_block = true;
        let unblock = Arc::clone(&conn.unblock);
        let reply = {
            let run = crate::cmd::execute(shared, conn, args, idx);
            tokio::pin!(run);
            let mut watching = true;
            loop {
                tokio::select! {
                    reply = &mut run => break reply,
                    r = io.rd.read_buf(io.inbuf), if watching => match r {
                        Ok(0) | Err(_) => {
                            unblock.notify.notify_one();
                            watching = false;
                        }
                        Ok(_) => watching = io.inbuf.len() < io.query_limit,
                    },
                    _ = io.kill_wake.notified(), if watching => {
                        unblock.notify.notify_one();
                        io.kill_wake.notify_one();
                        watching = false;
                    }
                }
            }
        };
        conn.may_block = false;
        conn.lap = None;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(n: usize, value_bytes: usize) -> BytesMut {
        let value = "v".repeat(value_bytes);
        let mut b = BytesMut::new();
        for i in 0..n {
            let key = format!("k{i}");
            b.extend_from_slice(
                format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
                    key.len(),
                    value.len()
                )
                .as_bytes(),
            );
        }
        b
    }

    /// Beside other clients, a pipeline of large writes runs in turns of about
    /// `TURN_BYTES`, so a reader waits a turn, not the pipeline; alone, or with what the
    /// turn parsed being all there was, it runs whole.
    #[test]
    fn a_pipeline_runs_in_turns_beside_other_clients() {
        let limits = Limits::default();
        let mut reader = RequestReader::default();
        let mut batch = Requests::default();
        let mut inbuf = pipeline(100, 1024);
        let mut turns = Vec::new();
        loop {
            let t = take_turn(&mut reader, &mut inbuf, &limits, true, &mut batch);
            assert!(t.protocol_error.is_none());
            turns.push(batch.len());
            assert_eq!(t.turn_ended, t.more_buffered);
            if !t.turn_ended {
                break;
            }
        }
        assert_eq!(turns.iter().sum::<usize>(), 100);
        assert!(turns.len() >= 6, "turns of about 16 KiB: {turns:?}");
        assert!(
            turns.iter().all(|&n| n <= TURN_BYTES / 1024 + 1),
            "{turns:?}"
        );

        let mut alone = pipeline(100, 1024);
        let t = take_turn(&mut reader, &mut alone, &limits, false, &mut batch);
        assert_eq!(
            (batch.len(), t.turn_ended, t.more_buffered),
            (100, false, false)
        );

        // A pipeline that ends within the turn's last request is one turn.
        let mut exact = pipeline(16, 1024);
        let t = take_turn(&mut reader, &mut exact, &limits, true, &mut batch);
        assert_eq!((batch.len(), t.turn_ended), (16, false));
    }
}
