//! File-system helpers both daemons use: the checks they make before they
//! start (`--check-config`) and the bounded read of their config files.

use std::io;
use std::path::Path;

/// Why this process could not create a file in the directory `dir`, or
/// `None` when it could: `faccessat(2)` for write and search permission
/// with the effective ids (`AT_EACCESS`), so the kernel judges owner,
/// group, ACLs, capabilities and read-only mounts as it will for the
/// creation. Creates nothing.
pub fn cannot_create_in(dir: &Path) -> Option<io::Error> {
    use rustix::fs::{accessat, Access, AtFlags, CWD};
    accessat(
        CWD,
        dir,
        Access::WRITE_OK | Access::EXEC_OK,
        AtFlags::EACCESS,
    )
    .err()
    .map(io::Error::from)
}

/// The first `limit + 1` bytes of the file at `path`, at most: a config
/// read must not stall a host on a path that is not one (`/dev/zero`, a
/// huge file), so a caller refuses a result longer than `limit`.
///
/// # Errors
/// The OS error of opening or reading the file.
pub fn read_at_most(path: &Path, limit: usize) -> io::Result<Vec<u8>> {
    use io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_an_error_and_a_temp_dir_is_not() {
        let dir = std::env::temp_dir();
        assert!(cannot_create_in(&dir).is_none());
        let missing = dir.join("msr-shared-fs-test-no-such-dir");
        assert_eq!(
            cannot_create_in(&missing).map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
    }
}
