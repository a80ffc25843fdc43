//! The events and their encoding, as vLLM's publisher writes them (`vllm/distributed/
//! kv_events.py`; fields as of vLLM 0.14–0.16: `BlockStored` gained `lora_name` in 0.14, and
//! later fields all have defaults a decoder fills in). A batch is always a positional array
//! `[ts, [event, ...], dp_rank]`; each event is either a tagged positional array
//! (`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//! medium, lora_name]`, what llm-d's indexer decodes) or a map tagged by `type` (what vLLM
//! sends since it dropped `array_like` from its events).

use rmp::encode as mp;
use serde::{Deserialize, Serialize};

/// How events are written: tagged positional arrays or maps tagged by `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Array,
    Map,
}

/// Where a chunk's blocks are announced, by the names KV-aware routers map: `DISK` while
/// this node's own store holds it (RocksDB or the value log on local disk, with DRAM as
/// their cache), `EXTERNAL` once only the object store does (Dynamo's external tier; llm-d
/// takes any name, lowercased). DRAM's contents are not announced: they change with every
/// few reads, and a chunk in DRAM is on local disk too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    Disk,
    External,
}

impl Medium {
    pub fn name(self) -> &'static str {
        match self {
            Medium::Disk => "DISK",
            Medium::External => "EXTERNAL",
        }
    }
}

/// One event of the feed.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Blocks now held in `medium`: their ids, the id of the block before the first (none
    /// for a prompt's first block), their tokens in order, and the tokens per block.
    Stored {
        block_hashes: Vec<u64>,
        parent: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        medium: Medium,
    },
    /// Blocks no longer held in `medium`.
    Removed {
        block_hashes: Vec<u64>,
        medium: Medium,
    },
    /// Everything this node announced is gone.
    AllCleared,
}

type Buf = Vec<u8>;

fn ids(out: &mut Buf, ids: &[u64]) {
    mp::write_array_len(out, ids.len() as u32).expect("vec write");
    for &id in ids {
        mp::write_uint(out, id).expect("vec write");
    }
}

fn str(out: &mut Buf, s: &str) {
    mp::write_str(out, s).expect("vec write");
}

fn nil(out: &mut Buf) {
    mp::write_nil(out).expect("vec write");
}

impl Event {
    fn tag(&self) -> &'static str {
        match self {
            Event::Stored { .. } => "BlockStored",
            Event::Removed { .. } => "BlockRemoved",
            Event::AllCleared => "AllBlocksCleared",
        }
    }

    /// The fields after the tag, in vLLM's order: each as its name and a writer.
    fn fields(&self) -> Vec<(&'static str, Field<'_>)> {
        match self {
            Event::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium,
            } => vec![
                ("block_hashes", Field::Ids(block_hashes)),
                ("parent_block_hash", parent.map_or(Field::Nil, Field::Uint)),
                ("token_ids", Field::Tokens(token_ids)),
                ("block_size", Field::Uint(*block_size as u64)),
                ("lora_id", Field::Nil),
                ("medium", Field::Str(medium.name())),
                ("lora_name", Field::Nil),
            ],
            Event::Removed {
                block_hashes,
                medium,
            } => vec![
                ("block_hashes", Field::Ids(block_hashes)),
                ("medium", Field::Str(medium.name())),
            ],
            Event::AllCleared => Vec::new(),
        }
    }

    /// Appends the event, encoded as `enc` says.
    pub fn encode(&self, enc: Encoding, out: &mut Buf) {
        let fields = self.fields();
        match enc {
            Encoding::Array => {
                mp::write_array_len(out, 1 + fields.len() as u32).expect("vec write");
                str(out, self.tag());
                for (_, f) in &fields {
                    f.write(out);
                }
            }
            Encoding::Map => {
                // Like msgspec with `omit_defaults`: a field that is nil by default is left
                // out (`lora_id`, `lora_name` and a first block's parent have no default in
                // vLLM, so they stay, as nil).
                mp::write_map_len(out, 1 + fields.len() as u32).expect("vec write");
                str(out, "type");
                str(out, self.tag());
                for (name, f) in &fields {
                    str(out, name);
                    f.write(out);
                }
            }
        }
    }

    /// How many bytes of memory the event holds, for the feed's queue limit.
    pub fn size(&self) -> usize {
        match self {
            Event::Stored {
                block_hashes,
                token_ids,
                ..
            } => 64 + 8 * block_hashes.len() + 4 * token_ids.len(),
            Event::Removed { block_hashes, .. } => 32 + 8 * block_hashes.len(),
            Event::AllCleared => 16,
        }
    }
}

enum Field<'a> {
    Nil,
    Uint(u64),
    Str(&'static str),
    Ids(&'a [u64]),
    Tokens(&'a [u32]),
}

impl Field<'_> {
    fn write(&self, out: &mut Buf) {
        match self {
            Field::Nil => nil(out),
            Field::Uint(v) => {
                mp::write_uint(out, *v).expect("vec write");
            }
            Field::Str(s) => str(out, s),
            Field::Ids(v) => ids(out, v),
            Field::Tokens(t) => {
                mp::write_array_len(out, t.len() as u32).expect("vec write");
                for &x in t.iter() {
                    mp::write_uint(out, x as u64).expect("vec write");
                }
            }
        }
    }
}

/// A batch's payload: `[ts, [events], dp_rank]`, `ts` in seconds since the epoch.
pub fn encode_batch(ts: f64, events: &[Event], enc: Encoding, dp_rank: u32) -> Buf {
    let mut out = Vec::with_capacity(64 + events.iter().map(Event::size).sum::<usize>());
    mp::write_array_len(&mut out, 3).expect("vec write");
    mp::write_f64(&mut out, ts).expect("vec write");
    mp::write_array_len(&mut out, events.len() as u32).expect("vec write");
    for e in events {
        e.encode(enc, &mut out);
    }
    mp::write_uint(&mut out, dp_rank as u64).expect("vec write");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decode(b: &[u8]) -> Value {
        rmpv::decode::read_value(&mut &b[..]).unwrap()
    }

    fn stored() -> Event {
        Event::Stored {
            block_hashes: vec![7, 8],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            medium: Medium::Disk,
        }
    }

    #[test]
    fn array_events_follow_vllms_positions() {
        let b = encode_batch(1.5, &[stored(), Event::AllCleared], Encoding::Array, 0);
        let v = decode(&b);
        let top = v.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].as_f64(), Some(1.5));
        assert_eq!(top[2].as_u64(), Some(0));
        let ev = top[1].as_array().unwrap();
        let s = ev[0].as_array().unwrap();
        assert_eq!(s[0].as_str(), Some("BlockStored"));
        assert_eq!(s[1], Value::Array(vec![7.into(), 8.into()]));
        assert!(s[2].is_nil());
        assert_eq!(s[3].as_array().unwrap().len(), 4);
        assert_eq!(s[4].as_u64(), Some(2));
        assert!(s[5].is_nil());
        assert_eq!(s[6].as_str(), Some("DISK"));
        assert_eq!(s.len(), 8);
        assert_eq!(ev[1], Value::Array(vec!["AllBlocksCleared".into()]));
    }

    #[test]
    fn map_events_are_tagged_by_type() {
        let removed = Event::Removed {
            block_hashes: vec![9],
            medium: Medium::External,
        };
        let b = encode_batch(2.0, &[removed], Encoding::Map, 0);
        let v = decode(&b);
        let ev = &v.as_array().unwrap()[1].as_array().unwrap()[0];
        let m: Vec<(String, Value)> = ev
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str().unwrap().to_string(), v.clone()))
            .collect();
        assert_eq!(m[0], ("type".into(), "BlockRemoved".into()));
        assert_eq!(m[1], ("block_hashes".into(), Value::Array(vec![9.into()])));
        assert_eq!(m[2], ("medium".into(), "EXTERNAL".into()));
    }
}
