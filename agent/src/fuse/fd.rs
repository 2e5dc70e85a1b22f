//! File-descriptor plumbing for keeping a FUSE connection across agent restarts: passing
//! `/dev/fuse` fds over a Unix socket (SCM_RIGHTS), the synthetic INIT that lets fuser adopt
//! an already-initialised connection, and FUSE_NOTIFY_RESEND. All of this module's unsafe
//! code is here, each block with its invariant.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Sends one text line, with `fd` attached if given.
pub fn send_line(sock: &UnixStream, line: &str, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let mut data = line.as_bytes().to_vec();
    data.push(b'\n');
    let raw = fd.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = raw
        .as_ref()
        .map(|r| vec![ControlMessage::ScmRights(r)])
        .unwrap_or_default();
    // A socket with a timeout returns EINTR on any signal, SA_RESTART or not (signal(7)).
    loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&data)],
            &cmsgs,
            MsgFlags::empty(),
            None,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map(drop).map_err(Into::into),
        }
    }
}

/// Receives one message (a text line of at most 4 KiB) and the fd attached to it, if any.
/// Empty string = the peer closed.
pub fn recv_line(sock: &UnixStream) -> std::io::Result<(String, Option<OwnedFd>)> {
    let mut buf = vec![0u8; 4096];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    // The keeper's socket has a read timeout, so any signal (a child exiting, say) fails the
    // call with EINTR even under SA_RESTART (signal(7)): retry. Seen in CI as "fd keeper
    // unavailable: Interrupted system call", which cost a restart its kept connection.
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r?,
        }
    };
    let mut fd = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just installed `raw` in our fd table for this message;
                // nothing else refers to it, so wrapping it gives it exactly one owner.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
        }
    }
    let n = msg.bytes;
    let text = String::from_utf8_lossy(&buf[..n]).trim_end().to_string();
    Ok((text, fd))
}

/// Makes fd number `target` refer to `with`'s open file (dup2). Used to swap the socket
/// fuser did its handshake on for the real `/dev/fuse` connection.
///
/// The caller guarantees no thread is reading or writing `target` during the call.
pub fn replace_fd(target: RawFd, with: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: `with` is a valid open fd (borrowed), `target` is an fd owned by a live object
    // the caller controls and that no thread uses right now; dup2 atomically closes and
    // replaces it, so the owner's later close() closes the new duplicate, not a stranger's fd.
    let rc = unsafe { libc::dup2(with.as_raw_fd(), target) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

const FUSE_INIT: u32 = 26;
const FUSE_NOTIFY_RESEND: i32 = 7;

/// A FUSE_INIT request as the kernel would send it (ABI 7.31, header + fuse_init_in), fed to
/// fuser's handshake when adopting a connection whose real INIT was answered by the
/// previous agent.
pub fn synthetic_init(max_readahead: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(104);
    // fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
    m.extend_from_slice(&104u32.to_le_bytes());
    m.extend_from_slice(&FUSE_INIT.to_le_bytes());
    m.extend_from_slice(&1u64.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    m.extend_from_slice(&[0u8; 16]);
    // fuse_init_in: major, minor, max_readahead, flags, flags2, unused[11]
    m.extend_from_slice(&7u32.to_le_bytes());
    m.extend_from_slice(&31u32.to_le_bytes());
    m.extend_from_slice(&max_readahead.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&[0u8; 44]);
    debug_assert_eq!(m.len(), 104);
    m
}

/// Asks the kernel (Linux ≥ 6.9) to queue again every request the previous daemon read but
/// never answered, so readers blocked on them get served by this one instead of hanging.
pub fn notify_resend(dev: impl AsFd) -> std::io::Result<()> {
    // fuse_out_header: len, error (= notify code), unique (0 = notification)
    let mut m = Vec::with_capacity(16);
    m.extend_from_slice(&16u32.to_le_bytes());
    m.extend_from_slice(&FUSE_NOTIFY_RESEND.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    nix::unistd::write(dev, &m)?;
    Ok(())
}
