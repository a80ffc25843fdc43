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
    let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let (mut rd, mut wr) = tokio::io::split(sock);
    let killed = Arc::new(AtomicBool::new(false));
    let last_cmd = Arc::new(AtomicUsize::new(0));
    let kill_wake = Arc::new(tokio::sync::Notify::new());
    let unblock = Arc::new(crate::blocked::Unblock::default());
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
        return;
    }
    let admitted = {
        let maxclients = shared.cfg.read().maxclients as usize;
        let mut clients = shared.clients.lock();
        let ok = clients.len() < maxclients;
        if ok {
            clients.insert(
                id,
                ClientEntry {
                    peer: peer.clone(),
                    name: String::new(),
                    user: "default".to_string(),
                    db: 0,
                    proto: 2,
                    created: Instant::now(),
                    last_cmd: Arc::clone(&last_cmd),
                    killed: Arc::clone(&killed),
                    kill_wake: Arc::clone(&kill_wake),
                    unblock: Arc::clone(&unblock),
                },
            );
            shared.clients_open.store(clients.len(), Ordering::Relaxed);
        }
        ok
    };
    if !admitted {
        shared
            .counters
            .rejected_connections
            .fetch_add(1, Ordering::Relaxed);
        let _ = wr
            .write_all(b"-ERR max number of clients reached\r\n")
            .await;
        return;
    }
    let open = {
        let cfg = shared.cfg.read();
        cfg.is_open()
    };
    let mut conn = Conn::new(id, peer, open);
    conn.last_cmd = last_cmd;
    conn.unblock = unblock;
    let mut stop = shared.shutdown.subscribe();
    let mut inbuf = BytesMut::with_capacity(16 << 10);
    let mut reader = RequestReader::default();
    let mut batch = Requests::default();
    let mut out = ReplyBuf::new(2);
    let mut last_activity = Instant::now();
    // When the first byte of a request that has not fully arrived was read.
    let mut partial_since: Option<Instant> = None;
    // The idle limit and a partial request's deadline are checked on this once-a-second
    // tick (one timer for the connection's life, not one per request).
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    'conn: loop {
        // The live settings, read once per round (CONFIG SET applies from the next one).
        let (limits, query_limit, request_timeout) = {
            let cfg = shared.cfg.read();
            (
                Limits {
                    bulk_bytes_max: cfg.proto_max_bulk_len as usize,
                    ..Limits::default()
                },
                cfg.client_query_buffer_limit as usize,
                Duration::from_secs(cfg.client_request_timeout_secs),
            )
        };
        let shares = shared.clients_open.load(Ordering::Relaxed) > 1;
        let Turn {
            protocol_error,
            more_buffered,
            turn_ended,
        } = take_turn(&mut reader, &mut inbuf, &limits, shares, &mut batch);
        if !batch.is_empty() {
            // A request arrived whole: the clock restarts for the next one.
            partial_since = None;
        }
        if !batch.is_empty()
            && run_batch(
                &shared,
                &mut conn,
                &batch,
                &mut out,
                Io {
                    rd: &mut rd,
                    inbuf: &mut inbuf,
                    query_limit,
                    kill_wake: &kill_wake,
                    wr: &mut wr,
                },
            )
            .await
            .is_err()
        {
            break 'conn;
        }
        // The arguments go now (their vector stays): held while the connection waits, they
        // would keep the read buffer's memory from its next requests.
        batch.clear();
        if let Some(e) = protocol_error {
            shared
                .counters
                .clients_cut_off_protocol_error
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(client = id, peer = %conn.peer, error = %e, "protocol error; closing connection");
            out.push(&Reply::Error(format!("ERR {e}")));
            let _ = write_out(&mut wr, &mut out, &shared, &mut conn.pending).await;
            break 'conn;
        }
        if turn_ended && out.len() < FLUSH_BYTES && !conn.quit && !killed.load(Ordering::Acquire) {
            // The others' turn; these replies leave with the next turn's.
            tokio::task::yield_now().await;
            continue;
        }
        if !out.is_empty() && shared.clients_open.load(Ordering::Relaxed) > 1 {
            // Other connections' requests that arrived with this one run before the replies
            // go out, so replies leave in a burst, as Redis writes them before it sleeps.
            // A lone client has no one to wait for: the turn through the scheduler (which
            // polls the I/O driver once more) cost it 3-6% of its requests per second.
            tokio::task::yield_now().await;
        }
        if !out.is_empty()
            && write_out(&mut wr, &mut out, &shared, &mut conn.pending)
                .await
                .is_err()
        {
            break 'conn;
        }
        if conn.quit || killed.load(Ordering::Acquire) {
            break 'conn;
        }
        if more_buffered {
            continue;
        }
        if inbuf.len() + reader.held_bytes() > query_limit {
            out.push(&Reply::err(
                "ERR query buffer limit exceeded; closing connection",
            ));
            let _ = write_out(&mut wr, &mut out, &shared, &mut conn.pending).await;
            break 'conn;
        }
        partial_since = if inbuf.is_empty() && !reader.is_pending() {
            None
        } else {
            Some(partial_since.unwrap_or_else(Instant::now))
        };
        if let (Some(t), false) = (partial_since, request_timeout.is_zero()) {
            if t.elapsed() >= request_timeout {
                shared
                    .counters
                    .clients_cut_off_slow_request
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(client = id, peer = %conn.peer, "request not completed in {request_timeout:?}; closing connection");
                out.push(&Reply::Error(format!(
                    "ERR request not completed within {} seconds; closing connection",
                    request_timeout.as_secs()
                )));
                let _ = write_out(&mut wr, &mut out, &shared, &mut conn.pending).await;
                break 'conn;
            }
        }
        let spare = inbuf.capacity() - inbuf.len();
        if reader.wanted() > spare {
            // A large argument is arriving: room for exactly the rest of it, so it is read
            // in place (the request's other arguments are held apart by the reader, so only
            // this argument's first bytes move). Its size passed the bulk limit.
            inbuf.reserve(reader.wanted());
        } else if spare < 8 << 10 {
            // Grow by at least what is buffered; the query buffer limit above bounds it.
            inbuf.reserve((64 << 10).max(inbuf.len()));
        }
        tokio::select! {
            r = rd.read_buf(&mut inbuf) => match r {
                Ok(0) | Err(_) => break 'conn,
                Ok(_) => last_activity = Instant::now(),
            },
            _ = stop.changed() => break 'conn,
            _ = kill_wake.notified() => break 'conn,
            // The idle limit can change live (CONFIG SET timeout), so check it every second;
            // the request deadline is checked at the top of the loop.
            _ = tick.tick() => {
                let idle = shared.cfg.read().timeout_secs;
                if idle > 0 && last_activity.elapsed() >= Duration::from_secs(idle) {
                    tracing::debug!(client = id, "idle timeout");
                    break 'conn;
                }
            }
        }
    }
    crate::cmd::flush_tally(&shared, &mut conn);
    shared.watches.unwatch(&mut conn.watched);
    shared.engine.end_stream(id);
    {
        let mut clients = shared.clients.lock();
        clients.remove(&id);
        shared.clients_open.store(clients.len(), Ordering::Relaxed);
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

async fn run_batch<S: AsyncRead + AsyncWrite>(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    batch: &Requests,
    out: &mut ReplyBuf,
    io: Io<'_, S>,
) -> std::io::Result<()> {
    let Io {
        rd,
        inbuf,
        query_limit,
        kill_wake,
        wr,
    } = io;
    let mut read_guard = None;
    let mut last_cmd = None;
    // Commands are timed from the end of the one before only while nothing is waited on
    // between them: whatever waits (the gate, a write, a blocking command) starts over.
    conn.lap = None;
    let mut next = 0;
    let mut run: Vec<&[Bytes]> = Vec::new();
    let mut replies = Vec::new();
    while next < batch.len() {
        let args = batch.get(next);
        next += 1;
        let kind = crate::cmd::run_kind(args, conn);
        let next_joins = |next: usize, conn: &Conn| {
            kind.is_some()
                && next < batch.len()
                && crate::cmd::run_kind(batch.get(next), conn) == kind
        };
        if let (Some(kind), true) = (kind, next_joins(next, conn)) {
            // Consecutive writes of one kind are written together (one batch, one log
            // record).
            let bytes_of = |a: &[Bytes]| a.iter().map(|x| x.len()).sum::<usize>();
            let mut bytes = bytes_of(args);
            run.push(args);
            while run.len() < crate::cmd::RUN_MAX
                && bytes < crate::cmd::RUN_BYTES_MAX
                && next_joins(next, conn)
            {
                let a = batch.get(next);
                next += 1;
                bytes += bytes_of(a);
                run.push(a);
            }
            if shared.blocked.any_woken() {
                after_woken(shared, conn, &run, &mut read_guard).await;
            }
            if read_guard.is_none() {
                match gate_read(shared).await {
                    Ok(g) => read_guard = Some(g),
                    Err(busy) => {
                        out.set_proto(conn.proto);
                        for _ in run.drain(..) {
                            out.push(&busy);
                        }
                        continue;
                    }
                }
            }
            last_cmd = run.last().map(|a| a[0].clone());
            crate::cmd::execute_run(shared, conn, kind, &run, &mut replies).await;
            conn.lap = None;
            run.clear();
            out.set_proto(conn.proto);
            for r in replies.drain(..) {
                out.push(&r);
            }
        } else {
            let idx = crate::cmd::lookup_request(args);
            let blocking = crate::cmd::is_blocking(idx, conn);
            // (A blocking command waits for its turn once it is blocked.)
            if !blocking && shared.blocked.any_woken() {
                after_woken(shared, conn, &[args], &mut read_guard).await;
            }
            if blocking {
                // A blocking command may wait for another client: the replies before it leave
                // now, and it runs without the gate (it takes it for each attempt).
                read_guard = None;
                conn.lap = None;
                crate::cmd::flush_tally(shared, conn);
                if !out.is_empty() {
                    write_out(wr, out, shared, &mut conn.pending).await?;
                }
                last_cmd = args.first().cloned();
                conn.may_block = true;
                let unblock = Arc::clone(&conn.unblock);
                let reply = {
                    let run = crate::cmd::execute(shared, conn, args, idx);
                    tokio::pin!(run);
                    // While it waits, the socket is watched for the client leaving (what it sends
                    // meanwhile is kept for later, within the query buffer's limit).
                    let mut watching = true;
                    loop {
                        tokio::select! {
                            reply = &mut run => break reply,
                            r = rd.read_buf(inbuf), if watching => match r {
                                Ok(0) | Err(_) => {
                                    unblock.notify.notify_one();
                                    watching = false;
                                }
                                Ok(_) => watching = inbuf.len() < query_limit,
                            },
                            _ = kill_wake.notified(), if watching => {
                                unblock.notify.notify_one();
                                kill_wake.notify_one();
                                watching = false;
                            }
                        }
                    }
                };
                conn.may_block = false;
                conn.lap = None;
                out.set_proto(conn.proto);
                out.push(&reply);
            } else if crate::cmd::is_exclusive(idx, conn) {
                read_guard = None;
                conn.lap = None;
                let reply = match gate_write(shared).await {
                    Ok(_w) => crate::cmd::execute(shared, conn, args, idx).await,
                    Err(busy) => beside_busy_script(shared, conn, args, idx, busy).await,
                };
                out.set_proto(conn.proto);
                out.push(&reply);
            } else {
                let mut busy = None;
                if read_guard.is_none() {
                    conn.lap = None;
                    match gate_read(shared).await {
                        Ok(g) => read_guard = Some(g),
                        Err(b) => busy = Some(b),
                    }
                }
                last_cmd = args.first().cloned();
                let reply = match busy {
                    None => crate::cmd::execute(shared, conn, args, idx).await,
                    Some(b) => beside_busy_script(shared, conn, args, idx, b).await,
                };
                out.set_proto(conn.proto);
                out.push(&reply);
            }
        }
        if out.len() >= FLUSH_BYTES {
            // Never wait on a slow client while holding the gate.
            read_guard = None;
            crate::cmd::flush_tally(shared, conn);
            write_out(wr, out, shared, &mut conn.pending).await?;
            conn.lap = None;
        }
        if conn.quit {
            break;
        }
    }
    drop(read_guard);
    crate::cmd::flush_tally(shared, conn);
    // Clients these commands woke from a blocking pop try before the replies go (as in
    // Redis, where they are served first).
    shared.blocked.settled().await;
    if let Some(i) = last_cmd.and_then(|n| crate::cmd::lookup(&n)) {
        conn.last_cmd.store(i + 1, Ordering::Relaxed);
    }
    Ok(())
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
