//! The partition names file kept in every cache directory, so that a dataset finds its
//! blocks again after a restart (segments record partition ids, this file their names).

use std::io;
use std::path::Path;

const FILE: &str = "partitions";

/// Reads `(id, name)` pairs; a missing file is an empty list.
pub(crate) fn read(dir: &Path) -> io::Result<Vec<(u16, String)>> {
    let text = match std::fs::read_to_string(dir.join(FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| {
            let (id, name) = l.split_once('\t')?;
            Some((id.parse().ok()?, name.to_string()))
        })
        .collect())
}

/// Replaces the file atomically (write a temporary, then rename).
pub(crate) fn write(dir: &Path, names: &[(u16, String)]) -> io::Result<()> {
    let mut text = String::new();
    for (id, name) in names {
        text.push_str(&format!("{id}\t{name}\n"));
    }
    let tmp = dir.join(format!("{FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join(FILE))
}
