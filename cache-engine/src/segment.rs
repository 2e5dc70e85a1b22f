//! On-disk format of a segment file: pure encoding and decoding, no I/O.
//!
//! ```text
//! page 0            segment header (magic, version, id)
//! entries...        [header 40 B][value], 8-byte aligned; zero padding between them
//! footer            one 32-byte record per entry (written when the segment is sealed)
//! last page         trailer: magic, record count, footer offset, footer crc, own crc
//! ```
//! A sealed segment is indexed from its footer alone. An unsealed one (the process died
//! while it was active) is scanned header by header and cut at its last whole entry.
//! Values whose length is a multiple of 4 KiB, or at least 64 KiB, start on a page
//! boundary so that reading one costs exactly its pages (the header sits just before it).

use crate::api::Key;
use crate::io::{ALIGN, align_up};

/// Bytes of an entry header.
pub(crate) const HEADER: u64 = 40;
/// Bytes of one footer record.
const RECORD: usize = 32;
/// Offset of the first entry (page 0 holds the segment header).
pub(crate) const DATA_START: u64 = ALIGN as u64;
/// The entry is a removal marker (no value).
pub(crate) const FLAG_TOMBSTONE: u16 = 1;

const SEGMENT_MAGIC: u64 = 0x534c_5549_4345_5347; // "SLUICESG"
const ENTRY_MAGIC: u32 = 0x454e_5452; // "ENTR"
const TRAILER_MAGIC: u32 = 0x5452_4c52; // "TRLR"
const VERSION: u32 = 1;

/// One entry as listed in a footer or found by a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub key: Key,
    pub part: u16,
    pub flags: u16,
    /// File offset of the value.
    pub value_off: u32,
    pub len: u32,
    /// crc32c of key then value.
    pub crc: u32,
}

/// The checksum stored for an entry: crc32c over the key then the value, so an entry read
/// back for the wrong key fails it as surely as flipped bits do.
pub(crate) fn entry_crc(key: &Key, value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&key.0), value)
}

fn align8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Where an entry of `len` bytes goes when the segment's write position is `cur`:
/// (header offset, value offset, next write position).
pub(crate) fn place(cur: u64, len: u64) -> (u64, u64, u64) {
    let page_aligned = len >= 64 << 10 || (len > 0 && len.is_multiple_of(ALIGN as u64));
    let value_off = if page_aligned {
        align_up(cur + HEADER)
    } else {
        cur + HEADER
    };
    (value_off - HEADER, value_off, align8(value_off + len))
}

/// Page 0 of segment `id`.
pub(crate) fn encode_segment_header(id: u32, out: &mut [u8]) {
    out[..8].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&id.to_le_bytes());
}

/// Whether `page` is the header page of a segment of this format.
pub(crate) fn check_segment_header(page: &[u8]) -> bool {
    page.len() >= 16
        && page[..8] == SEGMENT_MAGIC.to_le_bytes()
        && page[8..12] == VERSION.to_le_bytes()
}

/// The 40-byte header written before each value.
pub(crate) fn encode_header(r: &Record) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
    h[8..24].copy_from_slice(&r.key.0);
    h[24..26].copy_from_slice(&r.part.to_le_bytes());
    h[26..28].copy_from_slice(&r.flags.to_le_bytes());
    h[28..32].copy_from_slice(&r.len.to_le_bytes());
    h[32..36].copy_from_slice(&r.crc.to_le_bytes());
    let hcrc = crc32c::crc32c(&h[8..]);
    h[4..8].copy_from_slice(&hcrc.to_le_bytes());
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

fn decode_header(h: &[u8], value_off: u64) -> Option<Record> {
    if u32_at(h, 0) != ENTRY_MAGIC || u32_at(h, 4) != crc32c::crc32c(&h[8..40]) {
        return None;
    }
    Some(Record {
        key: Key(h[8..24].try_into().unwrap()),
        part: u16_at(h, 24),
        flags: u16_at(h, 26),
        value_off: u32::try_from(value_off).ok()?,
        len: u32_at(h, 28),
        crc: u32_at(h, 32),
    })
}

/// Scans the entries of an unsealed segment (`file` is its whole content) and returns
/// the whole, checksum-valid ones and the end of the last one: the cut point.
pub(crate) fn scan(file: &[u8]) -> (Vec<Record>, u64) {
    let mut out = Vec::new();
    let mut pos = DATA_START as usize;
    let mut end = DATA_START;
    while pos + HEADER as usize <= file.len() {
        if file[pos..pos + 8] == [0; 8] {
            pos += 8; // padding before a page-aligned value or after a partial buffer
            continue;
        }
        let Some(r) = decode_header(&file[pos..pos + HEADER as usize], (pos as u64) + HEADER)
        else {
            break;
        };
        let v = r.value_off as usize;
        let Some(value) = file.get(v..v + r.len as usize) else {
            break;
        };
        if r.flags & FLAG_TOMBSTONE == 0 && entry_crc(&r.key, value) != r.crc {
            break;
        }
        out.push(r);
        end = align8(v as u64 + r.len as u64);
        pos = end as usize;
    }
    (out, end)
}

/// Footer and trailer of a segment whose data ends at `data_end`: the bytes to write at
/// `align_up(data_end)`, a whole number of pages.
pub(crate) fn encode_tail(records: &[Record], data_end: u64) -> (u64, Vec<u8>) {
    let footer_off = align_up(data_end);
    let footer_len = records.len() * RECORD;
    let total = align_up(footer_len as u64) as usize + ALIGN;
    let mut out = vec![0u8; total];
    for (i, r) in records.iter().enumerate() {
        let b = &mut out[i * RECORD..(i + 1) * RECORD];
        b[0..16].copy_from_slice(&r.key.0);
        b[16..18].copy_from_slice(&r.part.to_le_bytes());
        b[18..20].copy_from_slice(&r.flags.to_le_bytes());
        b[20..24].copy_from_slice(&r.value_off.to_le_bytes());
        b[24..28].copy_from_slice(&r.len.to_le_bytes());
        b[28..32].copy_from_slice(&r.crc.to_le_bytes());
    }
    let fcrc = crc32c::crc32c(&out[..footer_len]);
    let t = &mut out[total - ALIGN..];
    t[0..4].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
    t[4..8].copy_from_slice(&(records.len() as u32).to_le_bytes());
    t[8..16].copy_from_slice(&footer_off.to_le_bytes());
    t[16..20].copy_from_slice(&fcrc.to_le_bytes());
    let tcrc = crc32c::crc32c(&t[..20]);
    t[20..24].copy_from_slice(&tcrc.to_le_bytes());
    (footer_off, out)
}

/// Parses a trailer page: (record count, footer offset, footer crc).
pub(crate) fn decode_trailer(page: &[u8]) -> Option<(usize, u64, u32)> {
    if page.len() < 24
        || u32_at(page, 0) != TRAILER_MAGIC
        || u32_at(page, 20) != crc32c::crc32c(&page[..20])
    {
        return None;
    }
    let count = u32_at(page, 4) as usize;
    let off = u64::from_le_bytes(page[8..16].try_into().unwrap());
    Some((count, off, u32_at(page, 16)))
}

/// Bytes of the footer holding `count` records.
pub(crate) fn footer_len(count: usize) -> usize {
    count * RECORD
}

/// Parses a footer checked against the trailer's crc.
pub(crate) fn decode_footer(b: &[u8], count: usize, crc: u32) -> Option<Vec<Record>> {
    let b = b.get(..count * RECORD)?;
    if crc32c::crc32c(b) != crc {
        return None;
    }
    Some(
        b.chunks_exact(RECORD)
            .map(|c| Record {
                key: Key(c[0..16].try_into().unwrap()),
                part: u16_at(c, 16),
                flags: u16_at(c, 18),
                value_off: u32_at(c, 20),
                len: u32_at(c, 24),
                crc: u32_at(c, 28),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_cuts_at_the_last_whole_entry() {
        let mut file = vec![0u8; 64 << 10];
        let mut cur = DATA_START;
        let mut written = Vec::new();
        for i in 0..5u8 {
            let key = Key([i; 16]);
            let value = vec![i; 1000 + i as usize * 3000];
            let (h, v, next) = place(cur, value.len() as u64);
            let r = Record {
                key,
                part: 0,
                flags: 0,
                value_off: v as u32,
                len: value.len() as u32,
                crc: entry_crc(&key, &value),
            };
            file[h as usize..v as usize].copy_from_slice(&encode_header(&r));
            file[v as usize..v as usize + value.len()].copy_from_slice(&value);
            written.push((r, next));
            cur = next;
        }
        let (found, end) = scan(&file);
        assert_eq!(found.len(), 5);
        assert_eq!(end, cur);
        // Tear the last value: the scan keeps the first four.
        let last = written[4].0;
        file[last.value_off as usize + 10] ^= 0xff;
        let (found, end) = scan(&file);
        assert_eq!(found.len(), 4);
        assert_eq!(end, written[3].1);
    }

    #[test]
    fn footer_round_trips() {
        let recs: Vec<Record> = (0..100u32)
            .map(|i| Record {
                key: Key([i as u8; 16]),
                part: 3,
                flags: 0,
                value_off: i * 64,
                len: i,
                crc: i * 7,
            })
            .collect();
        let (off, tail) = encode_tail(&recs, 10_000);
        assert_eq!(off, 12288);
        let (count, foff, crc) = decode_trailer(&tail[tail.len() - ALIGN..]).unwrap();
        assert_eq!((count, foff), (100, off));
        assert_eq!(decode_footer(&tail, count, crc).unwrap(), recs);
    }
}
