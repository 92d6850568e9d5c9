//! Atomic file replacement: readers (and a crash) see either the old file or
//! the new one, never a mix.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes`: writes a temporary file next to it, flushes
/// it to disk, renames it over `path` and flushes the directory, so that the
/// rename itself survives a power loss. The file keeps its permissions.
///
/// The temporary file is created exclusively (`O_EXCL`, which never follows
/// a symbolic link) under an unpredictable name, so nothing planted in the
/// directory can redirect the write; the rename replaces `path` itself, so
/// a symbolic link at `path` becomes a regular file and its target is left
/// alone.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path does not name a file"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    // Removed on drop unless persisted: an error leaves nothing behind.
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)?;
    // The permissions of the file itself, never those of a link's target.
    if let Ok(metadata) = fs::symlink_metadata(path)
        && metadata.file_type().is_file()
    {
        tmp.as_file().set_permissions(metadata.permissions())?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|err| err.error)?;
    sync_dir(dir)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sluice-persist-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("limits.yaml");
        fs::write(&path, "old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("limits.yaml")]);

        let err = write_atomic(&dir.join("missing/limits.yaml"), b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn planted_links_redirect_nothing() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let dir = scratch("links");
        let path = dir.join("limits.yaml");
        let victim = dir.join("victim");
        fs::write(&victim, "precious").unwrap();
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        // The name the temporary file had before (pid-based), and a link
        // in place of the file itself.
        symlink(
            &victim,
            dir.join(format!(".limits.yaml.{}.tmp", std::process::id())),
        )
        .unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );

        fs::remove_file(&path).unwrap();
        symlink(&victim, &path).unwrap();
        write_atomic(&path, b"newer").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(fs::read_to_string(&path).unwrap(), "newer");
        fs::remove_dir_all(&dir).unwrap();
    }
}
