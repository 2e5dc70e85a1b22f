//! The fd keeper: a tiny process (`sluice fdstore`) that holds each mount's `/dev/fuse` fd
//! while agents come and go. As long as one fd of a FUSE connection is open the kernel keeps
//! the mount alive: readers of a killed agent's mount block instead of failing with ENOTCONN,
//! and the next agent takes the fd back and resumes the same connection.
//!
//! Protocol: one line per connection, over a Unix socket (mode 0600):
//! `PUT <key>` + fd → `OK`; `GET <key>` → `OK` + fd, or `NONE`; `DROP <key>` → `OK`;
//! `EXIT` → `OK` and the keeper exits (clean agent shutdown).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fd::{recv_line, send_line};

/// Runs the keeper on `socket` until told to exit. Blocking; the process does nothing else.
pub fn run_keeper(socket: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let mut fds: HashMap<String, OwnedFd> = HashMap::new();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let Ok((line, fd)) = recv_line(&conn) else {
            continue;
        };
        let (cmd, key) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let reply = match (cmd, fd) {
            ("PUT", Some(fd)) => {
                fds.insert(key.to_string(), fd);
                send_line(&conn, "OK", None)
            }
            ("GET", _) => match fds.get(key) {
                Some(fd) => send_line(&conn, "OK", Some(fd.as_fd())),
                None => send_line(&conn, "NONE", None),
            },
            ("DROP", _) => {
                fds.remove(key);
                send_line(&conn, "OK", None)
            }
            ("EXIT", _) => {
                let _ = send_line(&conn, "OK", None);
                break;
            }
            _ => send_line(&conn, "ERR unknown command", None),
        };
        let _ = reply;
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// The agent's handle on the keeper.
#[derive(Debug, Clone)]
pub struct FdStore {
    socket: PathBuf,
}

impl FdStore {
    /// Connects to the keeper at `socket`, starting one (`<exe> fdstore --socket …`, in its
    /// own process group so a signal to the agent's group does not reach it) if none answers.
    pub fn connect_or_spawn(socket: &Path) -> std::io::Result<FdStore> {
        let store = FdStore {
            socket: socket.into(),
        };
        if UnixStream::connect(socket).is_ok() {
            return Ok(store);
        }
        let exe = std::env::current_exe()?;
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(exe)
            .arg("fdstore")
            .arg("--socket")
            .arg(socket)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if UnixStream::connect(socket).is_ok() {
                // Reap it in the background if it ever exits while we run.
                std::thread::spawn(move || child.wait());
                return Ok(store);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::other(format!(
            "fd keeper did not start on {}",
            socket.display()
        )))
    }

    fn call(
        &self,
        line: &str,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> std::io::Result<(String, Option<OwnedFd>)> {
        let conn = UnixStream::connect(&self.socket)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        send_line(&conn, line, fd)?;
        recv_line(&conn)
    }

    /// Hands `fd` to the keeper under `key` (the mount point).
    pub fn put(&self, key: &str, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        match self.call(&format!("PUT {key}"), Some(fd))? {
            (ok, _) if ok == "OK" => Ok(()),
            (other, _) => Err(std::io::Error::other(format!("fd keeper: {other}"))),
        }
    }

    /// The fd kept under `key`, if any.
    pub fn get(&self, key: &str) -> std::io::Result<Option<OwnedFd>> {
        let (line, fd) = self.call(&format!("GET {key}"), None)?;
        Ok(if line == "OK" { fd } else { None })
    }

    /// Forgets `key` (its mount was unmounted).
    pub fn drop_key(&self, key: &str) -> std::io::Result<()> {
        self.call(&format!("DROP {key}"), None).map(drop)
    }

    /// Tells the keeper to exit (clean shutdown, every mount unmounted).
    pub fn exit(&self) -> std::io::Result<()> {
        self.call("EXIT", None).map(drop)
    }
}
