//! Connections from this node to another node of the cluster, speaking RESP as a client:
//! the slot mover's `DUMP`/`RESTORE` traffic, and `KVC.WHERE`'s questions to the nodes that
//! serve the other groups of a prefix. Idle connections are kept per node, a few at most.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_resp::Reply;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long one request to another node may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
/// Longest line (a status, error or length) read from another node.
const LINE_BYTES_MAX: usize = 64 << 10;
/// Longest bulk string read from another node (replies between nodes are small: counts,
/// tiers, statuses).
const BULK_BYTES_MAX: usize = 1 << 20;
/// Most elements of an array read from another node, and most arrays nested.
const ARRAY_LEN_MAX: usize = 1 << 20;
const DEPTH_MAX: usize = 8;
/// Idle connections kept per node.
const IDLE_PER_NODE_MAX: usize = 4;

/// One connection to another node.
pub(crate) struct Link {
    r: BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: tokio::net::tcp::OwnedWriteHalf,
    to: String,
}

impl Link {
    /// Connects to `endpoint` (`host:port`), authenticating with `password` if it is not
    /// empty.
    pub(crate) async fn connect(endpoint: &str, password: &str) -> Result<Link, String> {
        let endpoint = endpoint.to_string();
        let s = tokio::time::timeout(TIMEOUT, TcpStream::connect(&endpoint))
            .await
            .map_err(|_| format!("connecting to {endpoint} timed out"))?
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        let _ = s.set_nodelay(true);
        let (r, w) = s.into_split();
        let mut link = Link {
            r: BufReader::new(r),
            w,
            to: endpoint,
        };
        if !password.is_empty() {
            link.call(&[b"AUTH", password.as_bytes()]).await?;
        }
        Ok(link)
    }

    /// Sends one command; `Err` on an error reply too.
    pub(crate) async fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        let cmd: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        let mut replies = self.send(&[cmd]).await?;
        match replies.pop() {
            Some(Reply::Error(e)) => Err(format!("{} refused: {e}", self.to)),
            Some(r) => Ok(r),
            None => Err(format!("{} sent no reply", self.to)),
        }
    }

    /// Sends `cmds` at once and reads one reply per command; any error reply fails it.
    pub(crate) async fn pipeline(&mut self, cmds: &[Vec<Bytes>]) -> Result<(), String> {
        let replies = self.send(cmds).await?;
        match replies.iter().find_map(|r| match r {
            Reply::Error(e) => Some(e),
            _ => None,
        }) {
            Some(e) => Err(format!("{} refused: {e}", self.to)),
            None => Ok(()),
        }
    }

    /// Sends `cmds` at once and reads their replies, error replies included.
    async fn send(&mut self, cmds: &[Vec<Bytes>]) -> Result<Vec<Reply>, String> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for c in cmds {
            out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
            for a in c {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
        }
        let to = self.to.clone();
        let io = async {
            self.w.write_all(&out).await?;
            let mut replies = Vec::with_capacity(cmds.len());
            for _ in cmds {
                replies.push(read_reply(&mut self.r, 0).await?);
            }
            Ok::<_, std::io::Error>(replies)
        };
        match tokio::time::timeout(TIMEOUT, io).await {
            Err(_) => Err(format!("{to} did not answer in time")),
            Ok(Err(e)) => Err(format!("talking to {to}: {e}")),
            Ok(Ok(r)) => Ok(r),
        }
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

/// Reads one reply (RESP2, and RESP3's null, double and boolean).
async fn read_reply<R: tokio::io::AsyncBufRead + Unpin + Send>(
    r: &mut R,
    depth: usize,
) -> std::io::Result<Reply> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(LINE_BYTES_MAX as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if n < 3 || !line.ends_with(b"\r\n") {
        return Err(bad("connection closed or reply line too long"));
    }
    let body = &line[1..n - 2];
    let text = || String::from_utf8_lossy(body).into_owned();
    let int = || -> std::io::Result<i64> {
        std::str::from_utf8(body)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad number in reply"))
    };
    Ok(match line[0] {
        b'+' => Reply::Simple(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Integer(int()?),
        b'_' => Reply::Null,
        b',' => Reply::Double(text().parse().map_err(|_| bad("bad double in reply"))?),
        b'#' => Reply::Integer(i64::from(body == b"t")),
        b'$' => {
            let len = int()?;
            if len < 0 {
                return Ok(Reply::Null);
            }
            let len = len as usize;
            if len > BULK_BYTES_MAX {
                return Err(bad("bulk reply too long"));
            }
            let mut b = vec![0; len + 2];
            r.read_exact(&mut b).await?;
            b.truncate(len);
            Reply::Bulk(Bytes::from(b))
        }
        b'*' | b'~' | b'>' => {
            let len = int()?;
            if len < 0 {
                return Ok(Reply::Null);
            }
            if len as usize > ARRAY_LEN_MAX || depth >= DEPTH_MAX {
                return Err(bad("array reply too long or too deep"));
            }
            let mut items = Vec::with_capacity(len as usize);
            for _ in 0..len {
                items.push(Box::pin(read_reply(r, depth + 1)).await?);
            }
            Reply::Array(items)
        }
        _ => return Err(bad("unexpected reply")),
    })
}

/// Idle connections to other nodes, a few per node.
#[derive(Default)]
pub(crate) struct Links {
    idle: Mutex<HashMap<String, Vec<Link>>>,
}

impl Links {
    /// Sends one command to `endpoint` (`host:port`), on an idle connection if one is kept
    /// (a connection that failed is dropped, not kept). Error replies are returned as
    /// replies.
    pub(crate) async fn call(
        &self,
        endpoint: &str,
        password: &str,
        args: &[&[u8]],
    ) -> Result<Reply, String> {
        let kept = self.idle.lock().get_mut(endpoint).and_then(Vec::pop);
        let mut link = match kept {
            Some(l) => l,
            None => Link::connect(endpoint, password).await?,
        };
        let cmd: Vec<Bytes> = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        let reply = link.send(&[cmd]).await?.pop();
        let mut idle = self.idle.lock();
        let list = idle.entry(endpoint.to_string()).or_default();
        if list.len() < IDLE_PER_NODE_MAX {
            list.push(link);
        }
        reply.ok_or_else(|| "no reply".to_string())
    }
}

/// The KV-cache namespaces node `endpoint` holds (`INFO kvcache`): each one's name as
/// `INFO` labels it, with its figures (`strata cluster status` sums them over the nodes).
pub async fn node_namespaces(
    endpoint: &str,
    password: &str,
) -> Result<Vec<strata_kvcache::SpaceFigures>, String> {
    let mut link = Link::connect(endpoint, password).await?;
    let text = match link.call(&[b"INFO", b"kvcache"]).await? {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        other => return Err(format!("{endpoint}: INFO answered {other:?}")),
    };
    Ok(text.lines().filter_map(namespace_line).collect())
}

/// One `ns_<name>:quota=..,used_bytes=..,chunks=..,dropped=..` line of `INFO kvcache`.
fn namespace_line(line: &str) -> Option<strata_kvcache::SpaceFigures> {
    let (name, fields) = line.trim_end().strip_prefix("ns_")?.split_once(':')?;
    let mut f = strata_kvcache::SpaceFigures {
        namespace: name.as_bytes().to_vec(),
        ..Default::default()
    };
    for kv in fields.split(',') {
        let (k, v) = kv.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        match k {
            "quota" => f.quota = v,
            "used_bytes" => f.used_bytes = v,
            "chunks" => f.chunks = v,
            "dropped" => f.dropped = v,
            _ => {}
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> std::io::Result<Reply> {
        let mut r = BufReader::new(bytes);
        read_reply(&mut r, 0).await
    }

    #[tokio::test]
    async fn replies_of_every_shape_are_read_and_bad_ones_refused() {
        let got = parse(b"*3\r\n:2\r\n*2\r\n$3\r\nhot\r\n$4\r\nwarm\r\n:150\r\n")
            .await
            .unwrap();
        assert_eq!(
            got,
            Reply::Array(vec![
                Reply::Integer(2),
                Reply::Array(vec![Reply::bulk("hot"), Reply::bulk("warm")]),
                Reply::Integer(150),
            ])
        );
        assert_eq!(parse(b"+OK\r\n").await.unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            parse(b"-MOVED 1 127.0.0.1:7000\r\n").await.unwrap(),
            Reply::Error("MOVED 1 127.0.0.1:7000".into())
        );
        assert_eq!(parse(b"$-1\r\n").await.unwrap(), Reply::Null);
        assert!(parse(b"$5\r\nab").await.is_err(), "a cut bulk string");
        assert!(parse(b":x\r\n").await.is_err());
        assert!(parse(b"?\r\n").await.is_err());
        assert!(parse(format!("${}\r\n", BULK_BYTES_MAX + 1).as_bytes())
            .await
            .is_err());
        let deep = "*1\r\n".repeat(DEPTH_MAX + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).await.is_err());
    }

    #[test]
    fn an_info_line_of_a_namespace_reads_back() {
        let f = namespace_line("ns_m1:quota=10,used_bytes=7,chunks=2,dropped=1\r").unwrap();
        assert_eq!(f.namespace, b"m1");
        assert_eq!((f.quota, f.used_bytes, f.chunks, f.dropped), (10, 7, 2, 1));
        assert!(namespace_line("# KVCache").is_none());
        assert!(namespace_line("ns_m1:quota=x").is_none());
    }
}
