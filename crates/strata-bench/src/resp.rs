//! A minimal blocking RESP client for benchmarks (no pipelining library in the way).

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;

pub enum Value {
    Nil,
    Int(#[allow(dead_code)] i64),
    Bulk(#[allow(dead_code)] Vec<u8>),
    Array(#[allow(dead_code)] Vec<Value>),
    Status,
}

pub struct Client {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    /// Where `call_into_buffer` lands values: reused across calls, as a real consumer reuses
    /// its staging memory (fresh pages would add the kernel's page zeroing to every read).
    buffer: Vec<u8>,
}

impl Client {
    pub fn connect(port: u16) -> anyhow::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        Ok(Client {
            // Small enough that most of a large value is read straight into its destination
            // (a read at least this long bypasses the buffer), not copied through it.
            r: BufReader::with_capacity(64 << 10, s.try_clone()?),
            w: BufWriter::with_capacity(1 << 20, s),
            buffer: Vec::new(),
        })
    }

    fn encode(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        write!(self.w, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.w, "${}\r\n", a.len())?;
            self.w.write_all(a)?;
            self.w.write_all(b"\r\n")?;
        }
        Ok(())
    }

    fn send(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        self.encode(args)?;
        self.w.flush()?;
        Ok(())
    }

    pub fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Value> {
        self.send(args)?;
        self.read()
    }

    /// Sends every command, then reads their replies: one pipeline, one round trip.
    pub fn pipeline(&mut self, commands: &[Vec<&[u8]>]) -> anyhow::Result<Vec<Value>> {
        for args in commands {
            self.encode(args)?;
        }
        self.w.flush()?;
        commands.iter().map(|_| self.read()).collect()
    }

    fn header(&mut self) -> anyhow::Result<(u8, i64)> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        anyhow::ensure!(line.len() >= 3, "connection closed");
        let body = std::str::from_utf8(&line[1..line.len() - 2])?;
        if line[0] == b'-' {
            anyhow::bail!("server error: {body}");
        }
        Ok((line[0], if line[0] == b'_' { -1 } else { body.parse()? }))
    }

    /// Sends a command whose reply is an array of bulk strings and reads the values, one
    /// after the other, into this client's reusable buffer; returns each value's length
    /// (`None` for nil).
    pub fn call_into_buffer(&mut self, args: &[&[u8]]) -> anyhow::Result<Vec<Option<usize>>> {
        self.send(args)?;
        let (kind, n) = self.header()?;
        anyhow::ensure!(kind == b'*', "expected an array reply");
        let mut lens = Vec::with_capacity(n.max(0) as usize);
        let mut at = 0;
        for _ in 0..n.max(0) {
            match self.header()? {
                (b'$', len) if len >= 0 => {
                    let len = len as usize;
                    if self.buffer.len() < at + len + 2 {
                        self.buffer.resize(at + len + 2, 0);
                    }
                    self.r.read_exact(&mut self.buffer[at..at + len + 2])?;
                    at += len;
                    lens.push(Some(len));
                }
                _ => lens.push(None),
            }
        }
        Ok(lens)
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
