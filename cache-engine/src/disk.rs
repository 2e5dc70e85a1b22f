//! One disk tier directory: its segment files, the active segment's write buffer, space
//! accounting with watermarks, and recovery of the segments found at open.
//!
//! Writes are batched: entries are appended to the active segment's page-aligned buffer,
//! which is written with one O_DIRECT write when the next entry does not fit. Until that
//! write completes, reads of those entries are served from the buffer. Buffer writes of
//! one directory are serialised (`flush_lock`), so a segment's footer is written after all
//! of its data. Space is reclaimed a whole segment at a time, oldest first.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::api::{DiskConfig, Key, OpenError};
use crate::io::{ALIGN, AlignedBuf, FileId, IoEngine, align_down, align_up};
use crate::segment::{self, DATA_START, HEADER, Record};

struct SegInfo {
    file: File,
    id: FileId,
    /// Bytes this segment counts against the directory's capacity.
    bytes: u64,
    sealed: bool,
}

struct Active {
    seg: u32,
    buf: AlignedBuf,
    /// File offset of `buf[0]` (page-aligned).
    buf_start: u64,
    buf_len: usize,
}

struct Pending {
    seg: u32,
    start: u64,
    buf: Arc<AlignedBuf>,
    len: usize,
}

#[derive(Default)]
struct State {
    segs: BTreeMap<u32, SegInfo>,
    active: Option<Active>,
    pending: Vec<Pending>,
    /// Records of segments whose footer is not written yet.
    building: HashMap<u32, Vec<Record>>,
    used: u64,
    next_seg: u32,
}

/// Records found at open: per segment, in write order.
pub(crate) type Recovered = Vec<(u32, Vec<Record>)>;

/// A write the appender must run after releasing the state lock.
pub(crate) enum Job {
    Flush {
        seg: u32,
        start: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    },
    Seal {
        seg: u32,
        start: u64,
        buf: Arc<AlignedBuf>,
        len: usize,
    },
}

/// Where an appended entry went and what the appender must do next.
pub(crate) struct Appended {
    pub seg: u32,
    pub value_off: u64,
    pub jobs: Vec<Job>,
    /// Segments taken out of service to make room: their index entries must go.
    pub victims: Vec<u32>,
}

/// A read from this directory.
pub(crate) enum ReadOutcome {
    Value(Bytes),
    /// The segment is gone (evicted meanwhile).
    Gone,
    /// Fewer bytes than the entry's length: the file was cut.
    Short,
    Failed(io::Error),
}

/// Buffers of one directory written or waiting to be (each up to a block plus two pages).
const MAX_PENDING: usize = 4;

/// One disk tier directory.
pub(crate) struct Disk {
    pub id: u8,
    pub path: PathBuf,
    pub capacity: u64,
    high: f64,
    low: f64,
    segment_size: u64,
    buf_size: usize,
    engine: Arc<dyn IoEngine>,
    state: Mutex<State>,
    flush_lock: tokio::sync::Mutex<()>,
    /// Woken when a buffer write ends (see [`Disk::wait_for_room`]).
    room: tokio::sync::Notify,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub entries: AtomicU64,
}

fn dir_error(path: &Path, reason: impl Into<String>, source: Option<io::Error>) -> OpenError {
    OpenError::Directory {
        path: path.to_path_buf(),
        reason: reason.into(),
        source,
    }
}

fn open_direct(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

fn seg_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("seg-{id:010}.dat"))
}

/// Reads `len` bytes at `off` of an O_DIRECT file into an aligned buffer (blocking; open only).
fn read_direct(file: &File, off: u64, len: usize) -> io::Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(len);
    let mut done = 0;
    while done < len {
        match file.read_at(
            &mut buf[done..align_up(len as u64) as usize],
            off + done as u64,
        ) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// Checks that `dir` exists (creating it), is writable and accepts O_DIRECT.
fn check_directory(dir: &Path) -> Result<(), OpenError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| dir_error(dir, "cannot create the directory", Some(e)))?;
    let probe = dir.join(".sluice-probe");
    let file = open_direct(&probe, true).map_err(|e| match e.raw_os_error() {
        Some(libc::EINVAL) => dir_error(dir, "the filesystem does not support O_DIRECT (tmpfs?); put the cache on a disk filesystem such as ext4 or xfs", Some(e)),
        Some(libc::EACCES) | Some(libc::EROFS) | Some(libc::EPERM) => dir_error(dir, "the directory is not writable", Some(e)),
        _ => dir_error(dir, "cannot create a file", Some(e)),
    })?;
    let page = AlignedBuf::zeroed(ALIGN);
    let res = file.write_all_at(&page, 0);
    let _ = std::fs::remove_file(&probe);
    res.map_err(|e| match e.raw_os_error() {
        Some(libc::EINVAL) => dir_error(
            dir,
            "the filesystem does not support O_DIRECT writes (tmpfs?)",
            Some(e),
        ),
        Some(libc::ENOSPC) => dir_error(dir, "no space left on the device", Some(e)),
        _ => dir_error(dir, "cannot write", Some(e)),
    })
}

impl Disk {
    /// Opens (creating or recovering) directory `id`; returns the records found, by
    /// segment in write order, for the index to replay.
    pub(crate) fn open(
        id: u8,
        cfg: &DiskConfig,
        segment_size: u64,
        max_value_size: u64,
        engine: Arc<dyn IoEngine>,
    ) -> Result<(Disk, Recovered), OpenError> {
        let dir = cfg.path.as_path();
        check_directory(dir)?;
        let buf_size = align_up((1u64 << 20).max(max_value_size + 2 * ALIGN as u64)) as usize;
        let mut ids: Vec<u32> = std::fs::read_dir(dir)
            .map_err(|e| dir_error(dir, "cannot list the directory", Some(e)))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("seg-")?
                    .strip_suffix(".dat")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        let mut st = State::default();
        let mut found = Vec::new();
        for seg in ids {
            let path = seg_path(dir, seg);
            match recover_segment(&path) {
                Ok(Some((file, records, bytes))) => {
                    let fid = engine
                        .add_file(&file)
                        .map_err(|e| dir_error(dir, "cannot register a segment file", Some(e)))?;
                    st.used += bytes;
                    st.segs.insert(
                        seg,
                        SegInfo {
                            file,
                            id: fid,
                            bytes,
                            sealed: true,
                        },
                    );
                    found.push((seg, records));
                }
                Ok(None) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "dropping an unreadable segment: {e}");
                    let _ = std::fs::remove_file(&path);
                }
            }
            st.next_seg = seg + 1;
        }
        let disk = Disk {
            id,
            path: cfg.path.clone(),
            capacity: cfg.capacity,
            high: cfg.high_watermark,
            low: cfg.low_watermark,
            segment_size,
            buf_size,
            engine,
            state: Mutex::new(st),
            flush_lock: tokio::sync::Mutex::new(()),
            room: tokio::sync::Notify::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        };
        Ok((disk, found))
    }

    /// Bytes of segments held now.
    pub(crate) fn used(&self) -> u64 {
        self.state.lock().unwrap().used
    }

    /// Starts a new active segment, first taking old segments out of service if the
    /// directory is above its high watermark.
    fn open_segment(&self, st: &mut State, victims: &mut Vec<u32>) -> io::Result<()> {
        let need = self.segment_size;
        let high = (self.capacity as f64 * self.high) as u64;
        let low = (self.capacity as f64 * self.low) as u64;
        if st.used + need > high {
            while st.used + need > low {
                let Some((&seg, _)) = st.segs.iter().find(|(_, s)| s.sealed) else {
                    break;
                };
                let info = st.segs.remove(&seg).expect("segment listed");
                st.used -= info.bytes;
                self.engine.remove_file(info.id);
                drop(info.file);
                let _ = std::fs::remove_file(seg_path(&self.path, seg));
                victims.push(seg);
            }
        }
        if st.used + need > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "tier full: {} of {} bytes in segments and none can be evicted yet",
                    st.used, self.capacity
                ),
            ));
        }
        let seg = st.next_seg;
        let path = seg_path(&self.path, seg);
        let file = open_direct(&path, true)?;
        // Reserve the whole segment now: a full disk fails here, before any entry is
        // accepted into a segment that could not hold it.
        // SAFETY: fallocate(2) on a descriptor we own, with valid arguments.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                0,
                need as libc::off_t,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let id = match self.engine.add_file(&file) {
            Ok(id) => id,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        st.next_seg += 1;
        let mut buf = AlignedBuf::zeroed(self.buf_size);
        segment::encode_segment_header(seg, &mut buf[..ALIGN]);
        st.segs.insert(
            seg,
            SegInfo {
                file,
                id,
                bytes: need,
                sealed: false,
            },
        );
        st.used += need;
        st.building.insert(seg, Vec::new());
        st.active = Some(Active {
            seg,
            buf,
            buf_start: 0,
            buf_len: DATA_START as usize,
        });
        Ok(())
    }

    /// Waits while [`MAX_PENDING`] buffers are waiting for their write: the backpressure
    /// that keeps a source faster than the disk from piling up write buffers (21 of them,
    /// 88 MiB, behind a 64 MiB memory tier reading a local directory).
    pub(crate) async fn wait_for_room(&self) {
        loop {
            // Registered before the check, so a write ending in between still wakes us.
            let written = self.room.notified();
            if self.state.lock().unwrap().pending.len() < MAX_PENDING {
                return;
            }
            written.await;
        }
    }

    /// Appends an entry (a tombstone when `flags` says so) to the active segment.
    pub(crate) fn append(
        &self,
        key: Key,
        part: u16,
        flags: u16,
        value: &[u8],
        crc: u32,
    ) -> io::Result<Appended> {
        let len = value.len() as u64;
        let mut jobs = Vec::new();
        let mut victims = Vec::new();
        let mut st = self.state.lock().unwrap();
        loop {
            if st.active.is_none() {
                self.open_segment(&mut st, &mut victims)?;
            }
            let a = st.active.as_mut().expect("active segment");
            let cur = a.buf_start + a.buf_len as u64;
            let (hdr_off, value_off, end) = segment::place(cur, len);
            if end > self.segment_size && cur > DATA_START {
                // Full: seal it (the tail buffer is written with the footer) and go on in a new one.
                let a = st.active.take().expect("active segment");
                let buf = Arc::new(a.buf);
                st.pending.push(Pending {
                    seg: a.seg,
                    start: a.buf_start,
                    buf: buf.clone(),
                    len: a.buf_len,
                });
                jobs.push(Job::Seal {
                    seg: a.seg,
                    start: a.buf_start,
                    buf,
                    len: a.buf_len,
                });
                continue;
            }
            if end - a.buf_start > self.buf_size as u64 {
                let next_start = align_up(cur);
                let full = std::mem::replace(&mut a.buf, AlignedBuf::zeroed(self.buf_size));
                let (seg, start, blen) = (a.seg, a.buf_start, a.buf_len);
                a.buf_start = next_start;
                a.buf_len = 0;
                let buf = Arc::new(full);
                let wlen = align_up(blen as u64) as usize;
                st.pending.push(Pending {
                    seg,
                    start,
                    buf: buf.clone(),
                    len: wlen,
                });
                jobs.push(Job::Flush {
                    seg,
                    start,
                    buf,
                    len: wlen,
                });
                continue;
            }
            let rec = Record {
                key,
                part,
                flags,
                value_off: value_off as u32,
                len: len as u32,
                crc,
            };
            let h = (hdr_off - a.buf_start) as usize;
            a.buf[h..h + HEADER as usize].copy_from_slice(&segment::encode_header(&rec));
            let v = (value_off - a.buf_start) as usize;
            a.buf[v..v + value.len()].copy_from_slice(value);
            a.buf_len = (end - a.buf_start) as usize;
            let seg = a.seg;
            st.building
                .get_mut(&seg)
                .expect("building records")
                .push(rec);
            return Ok(Appended {
                seg,
                value_off,
                jobs,
                victims,
            });
        }
    }

    /// Runs a write produced by `append`; on failure returns the records it lost.
    pub(crate) async fn run(&self, job: Job) -> Result<(), (io::Error, Vec<Record>)> {
        let _serial = self.flush_lock.lock().await;
        match job {
            Job::Flush {
                seg,
                start,
                buf,
                len,
            } => {
                let file = self.state.lock().unwrap().segs.get(&seg).map(|s| s.id);
                let res = match file {
                    Some(id) => self.engine.write(id, start, buf, len).await,
                    None => Ok(()), // evicted meanwhile
                };
                let mut st = self.state.lock().unwrap();
                st.pending.retain(|p| !(p.seg == seg && p.start == start));
                self.room.notify_waiters();
                res.map_err(|e| {
                    let end = start + len as u64;
                    let mut lost = Vec::new();
                    if let Some(recs) = st.building.get_mut(&seg) {
                        recs.retain(|r| {
                            let inside =
                                (r.value_off as u64) >= start && (r.value_off as u64) < end;
                            if inside {
                                lost.push(*r);
                            }
                            !inside
                        });
                    }
                    (e, lost)
                })
            }
            Job::Seal {
                seg,
                start,
                buf,
                len,
            } => {
                let (file, records) = {
                    let mut st = self.state.lock().unwrap();
                    (
                        st.segs.get(&seg).map(|s| s.id),
                        st.building.remove(&seg).unwrap_or_default(),
                    )
                };
                let (footer_off, tail) = segment::encode_tail(&records, start + len as u64);
                let data_len = (footer_off - start) as usize;
                let mut out = AlignedBuf::zeroed(data_len + tail.len());
                out[..len].copy_from_slice(&buf[..len]);
                out[data_len..data_len + tail.len()].copy_from_slice(&tail);
                let total = data_len + tail.len();
                let res = match file {
                    Some(id) => self.engine.write(id, start, Arc::new(out), total).await,
                    None => Ok(()),
                };
                let mut st = self.state.lock().unwrap();
                st.pending.retain(|p| !(p.seg == seg && p.start == start));
                self.room.notify_waiters();
                match res {
                    Ok(()) => {
                        if let Some(info) = st.segs.get_mut(&seg) {
                            info.sealed = true;
                            let file_len = footer_off + tail.len() as u64;
                            // Give back the unused part of the reservation.
                            if file_len < info.bytes {
                                let _ = info.file.set_len(file_len);
                                let freed = info.bytes - file_len;
                                info.bytes = file_len;
                                st.used -= freed;
                            }
                        }
                        Ok(())
                    }
                    Err(e) => {
                        let lost = records
                            .into_iter()
                            .filter(|r| r.value_off as u64 >= start)
                            .collect();
                        if let Some(info) = st.segs.get_mut(&seg) {
                            info.sealed = true; // evictable; recovery will rescan it
                        }
                        Err((e, lost))
                    }
                }
            }
        }
    }

    /// Seals the active segment (at close).
    pub(crate) fn take_active(&self) -> Option<Job> {
        let mut st = self.state.lock().unwrap();
        let a = st.active.take()?;
        let buf = Arc::new(a.buf);
        st.pending.push(Pending {
            seg: a.seg,
            start: a.buf_start,
            buf: buf.clone(),
            len: a.buf_len,
        });
        Some(Job::Seal {
            seg: a.seg,
            start: a.buf_start,
            buf,
            len: a.buf_len,
        })
    }

    /// Reads the value at `value_off` of segment `seg`.
    pub(crate) async fn read(&self, seg: u32, value_off: u64, len: usize) -> ReadOutcome {
        let id = {
            let st = self.state.lock().unwrap();
            if let Some(a) = &st.active
                && a.seg == seg
                && value_off >= a.buf_start
            {
                let v = (value_off - a.buf_start) as usize;
                return match a.buf.get(v..v + len) {
                    Some(b) => ReadOutcome::Value(Bytes::copy_from_slice(b)),
                    None => ReadOutcome::Short,
                };
            }
            for p in &st.pending {
                if p.seg == seg
                    && value_off >= p.start
                    && value_off + len as u64 <= p.start + p.len as u64
                {
                    let v = (value_off - p.start) as usize;
                    return ReadOutcome::Value(Bytes::copy_from_slice(&p.buf[v..v + len]));
                }
            }
            match st.segs.get(&seg) {
                Some(s) => s.id,
                None => return ReadOutcome::Gone,
            }
        };
        let start = align_down(value_off);
        let end = align_up(value_off + len as u64);
        match self.engine.read(id, start, (end - start) as usize).await {
            Ok(b) => {
                let v = (value_off - start) as usize;
                if b.len() < v + len {
                    ReadOutcome::Short
                } else {
                    ReadOutcome::Value(b.slice(v..v + len))
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => ReadOutcome::Gone,
            Err(e) => {
                if self.state.lock().unwrap().segs.contains_key(&seg) {
                    ReadOutcome::Failed(e)
                } else {
                    ReadOutcome::Gone
                }
            }
        }
    }
}

/// Recovers one segment file: from its footer if sealed, else by scanning it and cutting
/// it at its last whole entry (then sealing it). `None`: nothing worth keeping.
fn recover_segment(path: &Path) -> io::Result<Option<(File, Vec<Record>, u64)>> {
    let file = open_direct(path, false)?;
    let len = file.metadata()?.len();
    if len < DATA_START + ALIGN as u64 {
        return Ok(None);
    }
    let head = read_direct(&file, 0, ALIGN)?;
    if !segment::check_segment_header(&head) {
        return Ok(None);
    }
    if len.is_multiple_of(ALIGN as u64) {
        let trailer = read_direct(&file, len - ALIGN as u64, ALIGN)?;
        if let Some((count, footer_off, crc)) = segment::decode_trailer(&trailer)
            && footer_off + (segment::footer_len(count) as u64) <= len - ALIGN as u64
            && footer_off >= DATA_START
        {
            let footer = read_direct(&file, footer_off, segment::footer_len(count))?;
            if let Some(records) = segment::decode_footer(&footer, count, crc) {
                return Ok(Some((file, records, len)));
            }
        }
    }
    // Unsealed: the process died while this segment was active.
    let data = read_direct(&file, 0, len as usize)?;
    let (records, end) = segment::scan(&data[..len as usize]);
    drop(data);
    if records.is_empty() {
        return Ok(None);
    }
    let (footer_off, tail) = segment::encode_tail(&records, end);
    file.set_len(footer_off)?;
    // The last data page may be partial: rewrite it together with the tail.
    let page = align_down(end);
    let keep = (end - page) as usize;
    let old = read_direct(&file, page, ALIGN)?;
    let mut out = AlignedBuf::zeroed((footer_off - page) as usize + tail.len());
    out[..keep].copy_from_slice(&old[..keep]);
    let t = (footer_off - page) as usize;
    out[t..t + tail.len()].copy_from_slice(&tail);
    file.write_all_at(&out[..t + tail.len()], page)?;
    file.sync_all()?;
    Ok(Some((file, records, footer_off + tail.len() as u64)))
}
