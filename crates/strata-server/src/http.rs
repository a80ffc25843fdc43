//! The HTTP listener: `/metrics` (Prometheus text: the command metrics, then every figure
//! of the engine and of the server) and `/healthz`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::shared::Shared;

/// Largest request head read, in bytes.
const HEAD_BYTES_MAX: usize = 4096;
/// How long a request head may take to arrive.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

fn body(shared: &Shared) -> String {
    let engine = shared.engine.stats_now();
    let server = shared.stats();
    let rows = engine.rows().into_iter().chain(server.rows());
    let mut o = crate::metrics::render(&shared.metrics, rows);
    crate::metrics::write_namespaces(&mut o, &shared.kvc_quotas.figures());
    o
}

/// Serves `/metrics` and `/healthz` until the server shuts down.
pub(crate) async fn serve_http(shared: Arc<Shared>, listener: TcpListener) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        let (mut sock, _) = tokio::select! {
            _ = stop.changed() => return,
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut buf = vec![0u8; HEAD_BYTES_MAX];
            let mut n = 0;
            // Read the request head (bounded in size and time).
            let read = tokio::time::timeout(HEAD_TIMEOUT, async {
                while n < buf.len() {
                    let m = sock.read(&mut buf[n..]).await?;
                    if m == 0 {
                        break;
                    }
                    n += m;
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", body(&shared)),
                "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
                _ => (
                    "404 Not Found",
                    "text/plain",
                    "not found; try /metrics or /healthz\n".to_string(),
                ),
            };
            let resp = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}
