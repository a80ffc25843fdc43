//! Segments: immutable cold-tier objects made of zstd-compressed blocks and a footer.
//!
//! ```text
//! segment: [block 0][block 1]...[block n-1][footer][trailer]
//! block (before compression): entries, sorted by key
//!   entry: key_len u32 | value_len u32 | expire_ms u64 | crc32c u32 | key | value
//!   (crc32c covers key || expire_ms || value)
//! block (stored): zstd(entries); its checksum crc32c(segment_id || block_no || stored bytes)
//!   lives in the footer and in every index entry, so a misdirected read is detected.
//! footer: magic "STRSEGv2" | segment_id u64 | block_count u32 | per block:
//!   offset u64 | len u32 | raw_len u32 | crc u32 | entry_count u32 | first_key_len u32 | first_key
//! trailer: footer_len u32 | crc32c(footer) u32 | magic "STRSEGv2"
//! ```
//!
//! Segments of layout 2 (magic `STRSEGv2`) hold stored keys (database, slot, client key:
//! [`crate::Key`]); those of layout 1 (`STRSEGv1`, still read) held the client's key, and
//! their footers give the first key's length in a u16. The cold index entry ([`BlockRef`])
//! carries everything needed to fetch one block with one ranged GET and check it, without
//! reading the footer, including which layout the segment's keys follow.

use crate::{
    entry_checksum, FormatError, Kind, Reader, Result, STORED_KEY_BYTES_MAX, VALUE_BYTES_MAX,
};

const MAGIC: &[u8; 8] = b"STRSEGv2";
const MAGIC_LAYOUT_1: &[u8; 8] = b"STRSEGv1";
const ENTRY_HEADER_BYTES: usize = 4 + 4 + 8 + 4;
/// Bytes of the fixed trailer at the end of every segment.
pub const FOOTER_TRAILER_BYTES: usize = 4 + 4 + 8;
/// An entry's key length is its low 24 bits (keys are far shorter); the value's kind is
/// the high 8 (0, a string, in segments written before other kinds existed).
const ENTRY_KIND_SHIFT: u32 = 24;
const _: () = assert!(STORED_KEY_BYTES_MAX < 1 << ENTRY_KIND_SHIFT);

/// Largest decompressed block accepted: one maximal entry.
const BLOCK_RAW_BYTES_MAX: usize = ENTRY_HEADER_BYTES + STORED_KEY_BYTES_MAX + VALUE_BYTES_MAX;

/// Where a cold key lives: the cold index entry stored in RocksDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    pub segment_id: u64,
    pub block: u32,
    pub offset: u64,
    pub len: u32,
    pub raw_len: u32,
    pub block_crc: u32,
    /// Authoritative expiry of the key (0 = none); `EXPIRE` on a cold key updates only this.
    pub expire_ms: u64,
    pub value_len: u32,
    /// The key layout of the segment's entries: 2 (stored keys), or 1 (client keys, in
    /// segments written before databases and slots). Encoded as the entry's version byte,
    /// with the value's kind in its high four bits.
    pub layout: u8,
    pub kind: Kind,
}

impl BlockRef {
    pub const ENCODED_BYTES: usize = 1 + 8 + 4 + 8 + 4 + 4 + 4 + 8 + 4;

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::ENCODED_BYTES);
        out.push(self.kind.tag(self.layout));
        out.extend_from_slice(&self.segment_id.to_le_bytes());
        out.extend_from_slice(&self.block.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.extend_from_slice(&self.block_crc.to_le_bytes());
        out.extend_from_slice(&self.expire_ms.to_le_bytes());
        out.extend_from_slice(&self.value_len.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, "index entry");
        let (layout, kind) = Kind::untag(r.u8()?)?;
        if layout != 1 && layout != 2 {
            return Err(FormatError::Bad {
                what: "index entry",
                detail: format!("version {layout}"),
            });
        }
        let out = BlockRef {
            segment_id: r.u64()?,
            block: r.u32()?,
            offset: r.u64()?,
            len: r.u32()?,
            raw_len: r.u32()?,
            block_crc: r.u32()?,
            expire_ms: r.u64()?,
            value_len: r.u32()?,
            layout,
            kind,
        };
        if r.remaining() != 0 {
            return Err(FormatError::Bad {
                what: "index entry",
                detail: "trailing bytes".into(),
            });
        }
        Ok(out)
    }

    /// The byte range of the block inside its segment object.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.len as u64
    }

    /// Which block this is: its segment and its number there (keys of one block share it).
    pub fn id(&self) -> (u64, u32) {
        (self.segment_id, self.block)
    }
}

fn block_checksum(segment_id: u64, block: u32, stored: &[u8]) -> u32 {
    let c = crc32c::crc32c(&segment_id.to_le_bytes());
    let c = crc32c::crc32c_append(c, &block.to_le_bytes());
    crc32c::crc32c_append(c, stored)
}

/// One block as described by the footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FooterBlock {
    pub offset: u64,
    pub len: u32,
    pub raw_len: u32,
    pub crc: u32,
    pub entry_count: u32,
    pub first_key: Vec<u8>,
}

/// The decoded footer of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub segment_id: u64,
    pub blocks: Vec<FooterBlock>,
    /// The key layout of the segment's entries (see [`BlockRef::layout`]).
    pub layout: u8,
}

impl Footer {
    /// The [`BlockRef`] of block `i` for a key with the given kind, expiry and value length.
    pub fn block_ref(&self, i: usize, kind: Kind, expire_ms: u64, value_len: u32) -> BlockRef {
        let b = &self.blocks[i];
        BlockRef {
            segment_id: self.segment_id,
            block: i as u32,
            offset: b.offset,
            len: b.len,
            raw_len: b.raw_len,
            block_crc: b.crc,
            expire_ms,
            value_len,
            layout: self.layout,
            kind,
        }
    }
}

/// A finished segment: its bytes and the index entry of every key in it, in key order.
pub struct Segment {
    pub id: u64,
    pub bytes: Vec<u8>,
    pub refs: Vec<(Vec<u8>, BlockRef)>,
}

/// Packs entries (pushed in strictly increasing key order) into a segment.
pub struct SegmentBuilder {
    id: u64,
    block_bytes_target: usize,
    zstd_level: i32,
    out: Vec<u8>,
    raw: Vec<u8>,
    raw_entries: Vec<(Vec<u8>, u64, u32, Kind)>,
    blocks: Vec<FooterBlock>,
    refs: Vec<(Vec<u8>, BlockRef)>,
    last_key: Option<Vec<u8>>,
}

impl SegmentBuilder {
    pub fn new(id: u64, block_bytes_target: usize, zstd_level: i32) -> Self {
        SegmentBuilder {
            id,
            block_bytes_target: block_bytes_target.max(1),
            zstd_level,
            out: Vec::new(),
            raw: Vec::new(),
            raw_entries: Vec::new(),
            blocks: Vec::new(),
            refs: Vec::new(),
            last_key: None,
        }
    }

    /// Bytes of entries pushed so far (before compression).
    pub fn raw_bytes(&self) -> usize {
        self.out.len() + self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty() && self.raw_entries.is_empty()
    }

    /// Appends one entry, a value of `kind`, under its stored key ([`crate::Key::stored`]).
    /// Keys must arrive in strictly increasing order.
    pub fn push(&mut self, kind: Kind, key: &[u8], value: &[u8], expire_ms: u64) -> Result<()> {
        if key.len() > STORED_KEY_BYTES_MAX {
            return Err(FormatError::TooLarge {
                what: "key",
                len: key.len(),
                max: STORED_KEY_BYTES_MAX,
            });
        }
        if value.len() > VALUE_BYTES_MAX {
            return Err(FormatError::TooLarge {
                what: "value",
                len: value.len(),
                max: VALUE_BYTES_MAX,
            });
        }
        if let Some(last) = &self.last_key {
            if key <= last.as_slice() {
                return Err(FormatError::Bad {
                    what: "segment",
                    detail: "keys out of order".into(),
                });
            }
        }
        let tagged_len = key.len() as u32 | (kind as u32) << ENTRY_KIND_SHIFT;
        self.raw.extend_from_slice(&tagged_len.to_le_bytes());
        self.raw
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.raw.extend_from_slice(&expire_ms.to_le_bytes());
        self.raw
            .extend_from_slice(&entry_checksum(kind, key, expire_ms, value).to_le_bytes());
        self.raw.extend_from_slice(key);
        self.raw.extend_from_slice(value);
        self.raw_entries
            .push((key.to_vec(), expire_ms, value.len() as u32, kind));
        self.last_key = Some(key.to_vec());
        if self.raw.len() >= self.block_bytes_target {
            self.seal_block()?;
        }
        Ok(())
    }

    fn seal_block(&mut self) -> Result<()> {
        if self.raw_entries.is_empty() {
            return Ok(());
        }
        let stored =
            zstd::bulk::compress(&self.raw, self.zstd_level).map_err(|e| FormatError::Bad {
                what: "block",
                detail: format!("zstd: {e}"),
            })?;
        let block_no = self.blocks.len() as u32;
        let fb = FooterBlock {
            offset: self.out.len() as u64,
            len: stored.len() as u32,
            raw_len: self.raw.len() as u32,
            crc: block_checksum(self.id, block_no, &stored),
            entry_count: self.raw_entries.len() as u32,
            first_key: self.raw_entries[0].0.clone(),
        };
        self.out.extend_from_slice(&stored);
        for (key, expire_ms, value_len, kind) in self.raw_entries.drain(..) {
            let r = BlockRef {
                segment_id: self.id,
                block: block_no,
                offset: fb.offset,
                len: fb.len,
                raw_len: fb.raw_len,
                block_crc: fb.crc,
                expire_ms,
                value_len,
                layout: crate::keys::LAYOUT_VERSION as u8,
                kind,
            };
            self.refs.push((key, r));
        }
        self.blocks.push(fb);
        self.raw.clear();
        Ok(())
    }

    /// Seals the last block and appends the footer and trailer.
    pub fn finish(mut self) -> Result<Segment> {
        self.seal_block()?;
        let mut footer = Vec::new();
        footer.extend_from_slice(MAGIC);
        footer.extend_from_slice(&self.id.to_le_bytes());
        footer.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for b in &self.blocks {
            footer.extend_from_slice(&b.offset.to_le_bytes());
            footer.extend_from_slice(&b.len.to_le_bytes());
            footer.extend_from_slice(&b.raw_len.to_le_bytes());
            footer.extend_from_slice(&b.crc.to_le_bytes());
            footer.extend_from_slice(&b.entry_count.to_le_bytes());
            footer.extend_from_slice(&(b.first_key.len() as u32).to_le_bytes());
            footer.extend_from_slice(&b.first_key);
        }
        let crc = crc32c::crc32c(&footer);
        self.out.extend_from_slice(&footer);
        self.out
            .extend_from_slice(&(footer.len() as u32).to_le_bytes());
        self.out.extend_from_slice(&crc.to_le_bytes());
        self.out.extend_from_slice(MAGIC);
        Ok(Segment {
            id: self.id,
            bytes: self.out,
            refs: self.refs,
        })
    }
}

/// Decodes the footer from a whole segment object.
pub fn decode_footer(segment: &[u8]) -> Result<Footer> {
    if segment.len() < FOOTER_TRAILER_BYTES {
        return Err(FormatError::Truncated {
            what: "segment trailer",
            need: FOOTER_TRAILER_BYTES,
            have: segment.len(),
        });
    }
    let trailer = &segment[segment.len() - FOOTER_TRAILER_BYTES..];
    let mut t = Reader::new(trailer, "segment trailer");
    let footer_len = t.u32()? as usize;
    let crc = t.u32()?;
    let magic = t.bytes(8)?;
    let layout = match magic {
        m if m == MAGIC => 2,
        m if m == MAGIC_LAYOUT_1 => 1,
        _ => {
            return Err(FormatError::Bad {
                what: "segment trailer",
                detail: "bad magic".into(),
            })
        }
    };
    let body_end = segment.len() - FOOTER_TRAILER_BYTES;
    if footer_len > body_end {
        return Err(FormatError::Truncated {
            what: "segment footer",
            need: footer_len,
            have: body_end,
        });
    }
    let footer = &segment[body_end - footer_len..body_end];
    if crc32c::crc32c(footer) != crc {
        return Err(FormatError::Checksum {
            what: "segment footer",
        });
    }
    let mut r = Reader::new(footer, "segment footer");
    if r.bytes(8)? != magic {
        return Err(FormatError::Bad {
            what: "segment footer",
            detail: "bad magic".into(),
        });
    }
    let segment_id = r.u64()?;
    let count = r.u32()? as usize;
    // Each block takes at least 26 bytes of footer, which bounds the allocation below.
    if count > r.remaining() / 26 {
        return Err(FormatError::Bad {
            what: "segment footer",
            detail: format!("{count} blocks"),
        });
    }
    let mut blocks = Vec::with_capacity(count);
    for _ in 0..count {
        let offset = r.u64()?;
        let len = r.u32()?;
        let raw_len = r.u32()?;
        let crc = r.u32()?;
        let entry_count = r.u32()?;
        let klen = match layout {
            1 => r.u16()? as usize,
            _ => r.u32()? as usize,
        };
        let first_key = r.bytes(klen)?.to_vec();
        if offset + len as u64 > (body_end - footer_len) as u64 {
            return Err(FormatError::Bad {
                what: "segment footer",
                detail: "block past end".into(),
            });
        }
        blocks.push(FooterBlock {
            offset,
            len,
            raw_len,
            crc,
            entry_count,
            first_key,
        });
    }
    Ok(Footer {
        segment_id,
        blocks,
        layout,
    })
}

/// Checks a stored block against its reference and decompresses it.
pub fn decode_block(r: &BlockRef, stored: &[u8]) -> Result<Vec<u8>> {
    if stored.len() != r.len as usize {
        return Err(FormatError::Truncated {
            what: "block",
            need: r.len as usize,
            have: stored.len(),
        });
    }
    if block_checksum(r.segment_id, r.block, stored) != r.block_crc {
        return Err(FormatError::Checksum { what: "block" });
    }
    let raw_len = r.raw_len as usize;
    if raw_len > BLOCK_RAW_BYTES_MAX {
        return Err(FormatError::TooLarge {
            what: "block",
            len: raw_len,
            max: BLOCK_RAW_BYTES_MAX,
        });
    }
    let raw = zstd::bulk::decompress(stored, raw_len).map_err(|e| FormatError::Bad {
        what: "block",
        detail: format!("zstd: {e}"),
    })?;
    if raw.len() != raw_len {
        return Err(FormatError::Bad {
            what: "block",
            detail: "decompressed length differs".into(),
        });
    }
    Ok(raw)
}

/// One entry of a decompressed block, with its checksum verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockEntry<'a> {
    pub kind: Kind,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub expire_ms: u64,
}

/// Iterates the entries of a decompressed block, verifying each checksum.
pub fn iter_block(raw: &[u8]) -> impl Iterator<Item = Result<BlockEntry<'_>>> {
    let mut r = Reader::new(raw, "block entry");
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || r.remaining() == 0 {
            return None;
        }
        let item = next_entry(&mut r);
        failed = item.is_err();
        Some(item)
    })
}

fn next_entry<'a>(r: &mut Reader<'a>) -> Result<BlockEntry<'a>> {
    let tagged_len = r.u32()?;
    let kind = Kind::from_u8((tagged_len >> ENTRY_KIND_SHIFT) as u8)?;
    let klen = (tagged_len & ((1 << ENTRY_KIND_SHIFT) - 1)) as usize;
    let vlen = r.u32()? as usize;
    let expire_ms = r.u64()?;
    let crc = r.u32()?;
    let key = r.bytes(klen)?;
    let value = r.bytes(vlen)?;
    if entry_checksum(kind, key, expire_ms, value) != crc {
        return Err(FormatError::Checksum {
            what: "block entry",
        });
    }
    Ok(BlockEntry {
        kind,
        key,
        value,
        expire_ms,
    })
}

/// Finds `key` in a decompressed block.
pub fn find_in_block<'a>(raw: &'a [u8], key: &[u8]) -> Result<Option<BlockEntry<'a>>> {
    for e in iter_block(raw) {
        let e = e?;
        if e.key == key {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings and hashes, alternating.
    fn kind_of(i: usize) -> Kind {
        [Kind::String, Kind::Hash][i % 2]
    }

    fn build(n: usize, block: usize) -> Segment {
        let mut b = SegmentBuilder::new(9, block, 1);
        for i in 0..n {
            let k = format!("key:{i:05}");
            let v = vec![i as u8; 100 + i];
            b.push(kind_of(i), k.as_bytes(), &v, i as u64).unwrap();
        }
        b.finish().unwrap()
    }

    #[test]
    fn every_key_is_found_through_its_ref_and_footer_matches() {
        let seg = build(300, 4096);
        let footer = decode_footer(&seg.bytes).unwrap();
        assert!(
            footer.blocks.len() > 5,
            "small blocks should give many blocks"
        );
        assert_eq!(footer.segment_id, 9);
        for (i, (key, r)) in seg.refs.iter().enumerate() {
            let enc = r.encode();
            assert_eq!(BlockRef::decode(&enc).unwrap(), *r);
            let raw = decode_block(r, &seg.bytes[r.offset as usize..][..r.len as usize]).unwrap();
            let e = find_in_block(&raw, key).unwrap().unwrap();
            assert_eq!(e.value, vec![i as u8; 100 + i].as_slice());
            assert_eq!((e.kind, r.kind), (kind_of(i), kind_of(i)));
            assert_eq!(
                footer.block_ref(r.block as usize, e.kind, e.expire_ms, e.value.len() as u32),
                *r
            );
        }
    }

    #[test]
    fn flipped_byte_in_block_is_a_checksum_error() {
        let mut seg = build(50, 1024);
        let r = seg.refs[10].1;
        seg.bytes[r.offset as usize + 3] ^= 0x40;
        let got = decode_block(&r, &seg.bytes[r.offset as usize..][..r.len as usize]);
        assert_eq!(got, Err(FormatError::Checksum { what: "block" }));
    }

    #[test]
    fn misdirected_block_is_detected() {
        let seg = build(50, 1024);
        let a = seg.refs[0].1;
        let b = seg.refs.last().unwrap().1;
        assert_ne!(a.block, b.block);
        let wrong = &seg.bytes[b.offset as usize..][..b.len as usize];
        let mut r = a;
        r.len = b.len;
        assert!(decode_block(&r, wrong).is_err());
    }

    #[test]
    fn keys_out_of_order_are_refused() {
        let mut b = SegmentBuilder::new(1, 1024, 1);
        b.push(Kind::String, b"b", b"1", 0).unwrap();
        assert!(b.push(Kind::String, b"a", b"1", 0).is_err());
        assert!(b.push(Kind::String, b"b", b"1", 0).is_err());
    }

    #[test]
    fn segments_of_layout_1_still_read_and_say_so() {
        // Written by Strata before databases and slots (the engine's test fixture).
        let seg: &[u8] = include_bytes!(
            "../../strata-engine/tests/fixtures/layout-1/cold/segments/0000000000000001.seg"
        );
        let footer = decode_footer(seg).unwrap();
        assert_eq!(footer.layout, 1);
        // Layout 1 stored the client's key as it came: no database or slot in front.
        let last = &footer.blocks.last().unwrap().first_key;
        assert!(
            last.starts_with(b"str:"),
            "{}",
            String::from_utf8_lossy(last)
        );
        let r = footer.block_ref(0, Kind::String, 0, 0);
        assert_eq!(r.layout, 1);
        assert_eq!(BlockRef::decode(&r.encode()).unwrap(), r);
        let b = &footer.blocks[0];
        let raw = decode_block(&r, &seg[b.offset as usize..][..b.len as usize]).unwrap();
        let first = iter_block(&raw).next().unwrap().unwrap();
        assert_eq!(first.key, b.first_key.as_slice());
        // New segments are layout 2.
        let seg = build(3, 1024);
        assert_eq!(decode_footer(&seg.bytes).unwrap().layout, 2);
        assert!(seg.refs.iter().all(|r| r.1.layout == 2));
    }

    #[test]
    fn a_first_key_of_the_largest_size_fits_the_footer() {
        let mut b = SegmentBuilder::new(4, 1024, 1);
        let key = vec![b'k'; STORED_KEY_BYTES_MAX];
        b.push(Kind::String, &key, b"v", 0).unwrap();
        let seg = b.finish().unwrap();
        let footer = decode_footer(&seg.bytes).unwrap();
        assert_eq!(footer.blocks[0].first_key, key);
        let mut b = SegmentBuilder::new(4, 1024, 1);
        assert!(b
            .push(Kind::String, &vec![b'k'; STORED_KEY_BYTES_MAX + 1], b"v", 0)
            .is_err());
    }

    #[test]
    fn garbage_footers_are_errors_not_panics() {
        let seg = build(20, 512);
        for cut in [0, 1, 15, 16, 40, seg.bytes.len() - 1] {
            assert!(decode_footer(&seg.bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = seg.bytes.clone();
        let n = bad.len();
        bad[n - 20] ^= 1;
        assert!(decode_footer(&bad).is_err());
    }
}
