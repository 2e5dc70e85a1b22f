//! Cgroup id → workload: which Kubernetes pod, systemd unit or plain cgroup a probe's
//! `bpf_get_current_cgroup_id()` belongs to.
//!
//! On cgroup v2 the id is the inode number of the cgroup's directory, so user space finds
//! it by walking the cgroup2 mount. Pure Rust, no BPF: tests build synthetic trees.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// What runs in a cgroup, as far as its path tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// A Kubernetes pod (cgroupfs or systemd cgroup driver).
    Pod {
        /// The pod's UID, with dashes (`metadata.uid`).
        uid: String,
        /// QoS class from the path: `guaranteed`, `burstable` or `besteffort`.
        qos: String,
        /// Container id when the cgroup is a container's (runtime prefix stripped).
        container: Option<String>,
    },
    /// A systemd unit on a bare-metal node (`system.slice/foo.service` → `foo.service`).
    SystemdUnit {
        /// The unit's name, e.g. `foo.service` or `session-3.scope`.
        unit: String,
    },
    /// Anything else: the cgroup path itself identifies the workload.
    Cgroup,
}

/// A resolved cgroup: its id, path below the cgroup2 root (`/a/b`), and workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupInfo {
    /// The cgroup id (inode of its directory).
    pub id: u64,
    /// Path relative to the cgroup2 root, starting with `/` (`/` is the root cgroup).
    pub path: String,
    /// Classification of `path`.
    pub workload: Workload,
}

/// The cgroup v2 mount point of this machine (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid hosts), read from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // "36 25 0:30 / /sys/fs/cgroup rw,… - cgroup2 cgroup2 rw"
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap_or("/")))
    })
}

/// Maps cgroup ids to workloads by walking a cgroup2 tree; remembers what it has seen.
#[derive(Debug)]
pub struct CgroupResolver {
    root: PathBuf,
    known: HashMap<u64, CgroupInfo>,
}

impl CgroupResolver {
    /// A resolver over the cgroup2 hierarchy mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            known: HashMap::new(),
        }
    }

    /// The cgroup with this id, rescanning the tree once when it is not known yet.
    /// `Ok(None)`: no such cgroup (it may have been removed since the event).
    pub fn resolve(&mut self, id: u64) -> io::Result<Option<CgroupInfo>> {
        if let Some(info) = self.known.get(&id) {
            return Ok(Some(info.clone()));
        }
        self.rescan()?;
        Ok(self.known.get(&id).cloned())
    }

    /// Forget every cgroup and walk the tree again (removed cgroups disappear).
    pub fn rescan(&mut self) -> io::Result<()> {
        let mut known = HashMap::new();
        let mut stack = vec![(self.root.clone(), String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            let meta = match std::fs::metadata(&dir) {
                Ok(m) => m,
                // A cgroup removed while we walk is not an error.
                Err(e) if e.kind() == io::ErrorKind::NotFound && rel != "/" => continue,
                Err(e) => return Err(e),
            };
            known.insert(
                meta.ino(),
                CgroupInfo {
                    id: meta.ino(),
                    workload: classify(&rel),
                    path: rel.clone(),
                },
            );
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let child = if rel == "/" {
                        format!("/{name}")
                    } else {
                        format!("{rel}/{name}")
                    };
                    stack.push((entry.path(), child));
                }
            }
        }
        self.known = known;
        Ok(())
    }
}

/// Classify a cgroup path (relative to the cgroup2 root, e.g. `/kubepods/burstable/pod…/…`).
pub fn classify(path: &str) -> Workload {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if let Some(k) = parts.iter().position(|p| p.contains("kubepods")) {
        for (i, part) in parts.iter().enumerate().skip(k) {
            if let Some((uid, qos)) = pod_uid(part) {
                let qos = qos
                    .or_else(|| parts[k..i].iter().find_map(|p| qos_in(p)))
                    .unwrap_or("guaranteed");
                let container = parts.get(i + 1).map(|c| container_id(c));
                return Workload::Pod {
                    uid,
                    qos: qos.to_owned(),
                    container,
                };
            }
        }
    }
    const UNIT_SUFFIXES: [&str; 5] = [".service", ".scope", ".socket", ".mount", ".swap"];
    if let Some(unit) = parts
        .iter()
        .rev()
        .find(|p| UNIT_SUFFIXES.iter().any(|s| p.ends_with(s)))
    {
        return Workload::SystemdUnit {
            unit: (*unit).to_owned(),
        };
    }
    Workload::Cgroup
}

/// The pod UID in one path component, and the QoS class when the component names it:
/// cgroupfs `pod<UID>`, systemd `kubepods-burstable-pod<UID_with_underscores>.slice`.
fn pod_uid(part: &str) -> Option<(String, Option<&'static str>)> {
    if let Some(uid) = part.strip_prefix("pod") {
        return looks_like_uid(uid).then(|| (uid.to_owned(), None));
    }
    let slice = part.strip_suffix(".slice")?;
    let at = slice.rfind("-pod")?;
    let uid = slice[at + 4..].replace('_', "-");
    looks_like_uid(&uid).then(|| (uid, qos_in(&slice[..at])))
}

fn qos_in(part: &str) -> Option<&'static str> {
    if part.contains("burstable") {
        Some("burstable")
    } else if part.contains("besteffort") {
        Some("besteffort")
    } else {
        None
    }
}

fn looks_like_uid(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// `cri-containerd-<id>.scope`, `docker-<id>.scope`, `crio-<id>`, or a bare id → `<id>`.
fn container_id(part: &str) -> String {
    let base = part.strip_suffix(".scope").unwrap_or(part);
    base.rsplit('-').next().unwrap_or(base).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const UID: &str = "0c7e6f6a-3a43-4b8e-9d1e-2f1d8a6b5c4d";
    const CTR: &str = "4f2d9a8b7c6e5d4c3b2a19081716151413121110";

    fn pod(qos: &str, container: Option<&str>) -> Workload {
        Workload::Pod {
            uid: UID.into(),
            qos: qos.into(),
            container: container.map(Into::into),
        }
    }

    #[test]
    fn classifies_cgroupfs_driver_paths() {
        assert_eq!(
            classify(&format!("/kubepods/burstable/pod{UID}/{CTR}")),
            pod("burstable", Some(CTR))
        );
        assert_eq!(
            classify(&format!("/kubepods/besteffort/pod{UID}")),
            pod("besteffort", None)
        );
        assert_eq!(
            classify(&format!("/kubepods/pod{UID}/{CTR}")),
            pod("guaranteed", Some(CTR))
        );
    }

    #[test]
    fn classifies_systemd_driver_paths() {
        let uid = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{CTR}.scope"
        );
        assert_eq!(classify(&path), pod("burstable", Some(CTR)));
        let path = format!("/kubepods.slice/kubepods-pod{uid}.slice/docker-{CTR}.scope");
        assert_eq!(classify(&path), pod("guaranteed", Some(CTR)));
    }

    #[test]
    fn classifies_systemd_units_and_others() {
        assert_eq!(
            classify("/system.slice/sluice.service"),
            Workload::SystemdUnit {
                unit: "sluice.service".into()
            }
        );
        assert_eq!(
            classify("/system.slice/trainer.service/worker"),
            Workload::SystemdUnit {
                unit: "trainer.service".into()
            }
        );
        assert_eq!(
            classify("/user.slice/user-0.slice/session-4.scope"),
            Workload::SystemdUnit {
                unit: "session-4.scope".into()
            }
        );
        assert_eq!(classify("/"), Workload::Cgroup);
        assert_eq!(classify("/batch/job-7"), Workload::Cgroup);
        // "pod" alone or a non-UID suffix is not a pod.
        assert_eq!(classify("/kubepods/burstable/podcast"), Workload::Cgroup);
    }

    fn ino(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn resolves_ids_in_a_synthetic_cgroupfs_tree() {
        let root = tempfile::tempdir().unwrap();
        let ctr = root
            .path()
            .join(format!("kubepods/burstable/pod{UID}/{CTR}"));
        std::fs::create_dir_all(&ctr).unwrap();
        let mut resolver = CgroupResolver::new(root.path());
        let info = resolver
            .resolve(ino(&ctr))
            .unwrap()
            .expect("container cgroup found");
        assert_eq!(info.path, format!("/kubepods/burstable/pod{UID}/{CTR}"));
        assert_eq!(info.workload, pod("burstable", Some(CTR)));
        assert_eq!(
            resolver.resolve(ino(root.path())).unwrap().unwrap().path,
            "/"
        );
        assert_eq!(resolver.resolve(u64::MAX).unwrap(), None);
    }

    #[test]
    fn resolves_ids_in_a_synthetic_systemd_tree_created_after_the_first_scan() {
        let root = tempfile::tempdir().unwrap();
        let mut resolver = CgroupResolver::new(root.path());
        resolver.rescan().unwrap();
        let uid = UID.replace('-', "_");
        let ctr = root.path().join(format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{CTR}.scope"
        ));
        std::fs::create_dir_all(&ctr).unwrap();
        let info = resolver
            .resolve(ino(&ctr))
            .unwrap()
            .expect("new cgroup found by a rescan");
        assert_eq!(info.workload, pod("besteffort", Some(CTR)));
        let unit = root.path().join("system.slice/sluice.service");
        std::fs::create_dir_all(&unit).unwrap();
        assert_eq!(
            resolver.resolve(ino(&unit)).unwrap().unwrap().workload,
            Workload::SystemdUnit {
                unit: "sluice.service".into()
            }
        );
    }

    #[test]
    fn resolves_a_real_cgroup_id() {
        let Some(root) = cgroup2_root() else {
            eprintln!("skipped: no cgroup2 mount on this machine");
            return;
        };
        let pod_dir = root.join(format!(
            "sluice-test-kubepods-{}/pod{UID}",
            std::process::id()
        ));
        let ctr = pod_dir.join(CTR);
        if let Err(e) = std::fs::create_dir_all(&ctr) {
            eprintln!(
                "skipped: cannot create a cgroup under {} ({e}); needs root",
                root.display()
            );
            return;
        }
        let id = ino(&ctr);
        let info = CgroupResolver::new(&root).resolve(id);
        for dir in [&ctr, &pod_dir, &pod_dir.parent().unwrap().to_path_buf()] {
            let _ = std::fs::remove_dir(dir);
        }
        let info = info.unwrap().expect("real cgroup found by its id");
        assert_eq!(info.id, id);
        assert_eq!(info.workload, pod("guaranteed", Some(CTR)));
    }
}
