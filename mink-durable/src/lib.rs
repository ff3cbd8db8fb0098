//! Files and directories that survive a power cut.
//!
//! POSIX promises less than `kill -9` tests show. A file's data is durable once the file
//! is fsynced; a *name* (a create, a rename, an unlink, a new directory) is durable only
//! once the directory holding it is fsynced. A process killed with `kill -9` keeps
//! everything the kernel buffered, and ext4's journal usually flushes names with the next
//! fsync of anything, so a missing directory fsync rarely shows; a power cut on a file
//! system that keeps only what POSIX promises loses the name, and with it the file.
//!
//! Every directory mink creates, and every rename and unlink mink relies on after a crash,
//! goes through this crate:
//!
//! - [`create_dir_all`]: creates missing ancestors, fsyncing each parent that gained one;
//! - [`rename`], [`remove_file`], [`remove_dir_all`]: the change, then its directory fsynced;
//! - [`write_atomically`]: a temporary file written and fsynced, renamed over the target,
//!   its directory fsynced: readers see the old bytes or the new, after any crash;
//! - [`sync_dir`], [`sync_parent`]: the directory fsync itself, for files created with
//!   other options or by others (SQLite).
//!
//! Errors name the path they concern.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Fsyncs `dir`, making the creates, renames and unlinks inside it durable.
///
/// # Errors
/// When `dir` cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| with_path(e, "syncing directory", dir))
}

/// Fsyncs the directory holding `path` (`.` for a bare name), making `path`'s name
/// durable: for files created by others (SQLite syncs the directory of a journal it
/// creates, not of a database file).
///
/// # Errors
/// When the directory cannot be opened or synced.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    sync_dir(parent(path))
}

/// Creates `dir` and its missing ancestors, fsyncing each parent that gained an entry.
/// Does nothing for a directory that exists.
///
/// # Errors
/// When a directory cannot be created or its parent synced (a file in the way included).
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().filter(|parent| !parent.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => sync_dir(parent.unwrap_or(Path::new("."))),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(with_path(e, "creating directory", dir)),
    }
}

/// Renames `from` to `to` and fsyncs the directories of both names (once when they share
/// one): after a crash `to` names the moved file, and `from` is gone.
///
/// # Errors
/// When the rename or a directory sync fails.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to).map_err(|e| with_path(e, "renaming", from))?;
    let to_dir = parent(to);
    sync_dir(to_dir)?;
    let from_dir = parent(from);
    if from_dir != to_dir {
        sync_dir(from_dir)?;
    }
    Ok(())
}

/// Removes the file `path` and fsyncs its directory, so it stays removed after a crash.
///
/// # Errors
/// When the unlink or the directory sync fails (a missing file included).
pub fn remove_file(path: &Path) -> io::Result<()> {
    std::fs::remove_file(path).map_err(|e| with_path(e, "removing", path))?;
    sync_parent(path)
}

/// Removes the directory `path` with everything under it and fsyncs its parent.
///
/// # Errors
/// When the removal or the parent's sync fails (a missing directory included).
pub fn remove_dir_all(path: &Path) -> io::Result<()> {
    std::fs::remove_dir_all(path).map_err(|e| with_path(e, "removing", path))?;
    sync_parent(path)
}

/// Replaces `path`'s contents with `bytes` so that after any crash it holds either the old
/// bytes or the new: `<path>.tmp` written and fsynced, renamed over `path`, the directory
/// fsynced.
///
/// # Errors
/// When a write, a sync or the rename fails; the temporary file may then be left behind
/// and is overwritten by the next call.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = Path::new(&temporary);
    let write = || {
        let mut file = File::create(temporary)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().map_err(|e| with_path(e, "writing", temporary))?;
    rename(temporary, path)
}

/// The directory holding `path` (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

fn with_path(error: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{doing} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_nested_directories_and_tolerates_existing_ones() {
        let root = tempfile::tempdir().expect("temp dir");
        let nested = root.path().join("a/b/c");
        create_dir_all(&nested).expect("create");
        assert!(nested.is_dir());
        create_dir_all(&nested).expect("exists already");
    }

    #[test]
    fn a_file_in_the_way_is_an_error_naming_it() {
        let root = tempfile::tempdir().expect("temp dir");
        let file = root.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let error = create_dir_all(&file.join("d")).expect_err("a file is in the way");
        assert!(
            error.to_string().contains(&file.display().to_string()),
            "{error}"
        );
    }

    #[test]
    fn writes_atomically_renames_and_removes() {
        let root = tempfile::tempdir().expect("temp dir");
        let path = root.path().join("state.json");
        write_atomically(&path, b"one").expect("first write");
        write_atomically(&path, b"two").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert!(!root.path().join("state.json.tmp").exists());

        let sub = root.path().join("sub");
        create_dir_all(&sub).expect("create");
        let moved = sub.join("moved.json");
        rename(&path, &moved).expect("rename across directories");
        assert!(moved.exists() && !path.exists());
        remove_file(&moved).expect("remove");
        assert!(!moved.exists());
        remove_dir_all(&sub).expect("remove dir");
        assert!(!sub.exists());
        assert!(remove_file(&moved).is_err(), "a missing file is an error");
    }
}
