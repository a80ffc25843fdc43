//! A minimal blocking RESP client for benchmarks (no pipelining library in the way).

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;

pub enum Value {
    Nil,
    Int(#[allow(dead_code)] i64),
    Bulk(Vec<u8>),
    Array(Vec<Value>),
    Status,
}

pub struct Client {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
}

impl Client {
    pub fn connect(port: u16) -> anyhow::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        Ok(Client {
            r: BufReader::with_capacity(1 << 20, s.try_clone()?),
            w: BufWriter::with_capacity(1 << 20, s),
        })
    }

    pub fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Value> {
        write!(self.w, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.w, "${}\r\n", a.len())?;
            self.w.write_all(a)?;
            self.w.write_all(b"\r\n")?;
        }
        self.w.flush()?;
        self.read()
    }

    fn read(&mut self) -> anyhow::Result<Value> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        anyhow::ensure!(line.len() >= 3, "connection closed");
        let body = std::str::from_utf8(&line[1..line.len() - 2])?;
        Ok(match line[0] {
            b'+' => Value::Status,
            b'-' => anyhow::bail!("server error: {body}"),
            b':' => Value::Int(body.parse()?),
            b'$' | b'=' => {
                let n: i64 = body.parse()?;
                if n < 0 {
                    Value::Nil
                } else {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut buf)?;
                    buf.truncate(n as usize);
                    Value::Bulk(buf)
                }
            }
            b'_' => Value::Nil,
            b'*' => {
                let n: i64 = body.parse()?;
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    items.push(self.read()?);
                }
                if n < 0 {
                    Value::Nil
                } else {
                    Value::Array(items)
                }
            }
            other => anyhow::bail!("unexpected reply type {}", other as char),
        })
    }
}
