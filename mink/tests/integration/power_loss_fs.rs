//! A file system that loses, at a power cut, all that POSIX lets a power cut lose.
//!
//! A disk keeps a file's data once the file is fsynced and a name (a create, a rename,
//! an unlink, a new directory) once its directory is fsynced; a power cut may drop
//! anything else. A `kill -9` drops nothing the kernel was given, so it cannot show a
//! missing fsync. [`PowerLossFs`] can: it mounts `tests/python/power_loss_fs.py` (FUSE)
//! over a temporary directory, and [`PowerLossFs::power_cut`] kills it and mounts again
//! exactly what was durable:
//!
//! ```text
//!   write, rename, ... ──► the mount (what readers see now)
//!   fsync, fsync(dir)  ──► the durable record ──► power_cut() ──► the mount, again
//! ```
//!
//! The tests below check those promises one by one, and that SQLite in WAL mode (mink's
//! catalog and metadata) keeps every committed row on it.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tempfile::TempDir;

use crate::python::python;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/power_loss_fs.py");

/// How long a mount may take before it counts as failed.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);

/// A power-loss file system mounted over a state directory.
#[derive(Debug)]
pub(crate) struct PowerLossFs {
    /// Holds `state/` (the file system's own), `mnt/` (the mount point) and `fs.log`
    /// (the file system process's stderr).
    dir: TempDir,
    /// `dir/mnt`.
    mount: PathBuf,
    child: Child,
}

impl PowerLossFs {
    /// Mounts a fresh, empty one (state and mount point in a new temporary directory).
    pub(crate) fn mount() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mount = dir.path().join("mnt");
        fs::create_dir(&mount).expect("mount point");
        let child = spawn(dir.path());
        Self { dir, mount, child }
    }

    /// Where it is mounted.
    pub(crate) fn path(&self) -> &Path {
        &self.mount
    }

    /// A power cut: kills the file system process (SIGKILL), unmounts (`umount -l`),
    /// keeps only what was durable (`power_loss_fs.py cut --verbose`, whose summary and
    /// list of what was lost go to stderr: a failing test shows them) and mounts it again at the same path. The caller kills every process
    /// using the mount (the mink server) first.
    pub(crate) fn power_cut(&mut self) {
        self.kill();
        let unmount = unmount(&self.mount);
        assert!(
            unmount.status.success(),
            "umount -l {}: {}",
            &self.mount.display(),
            String::from_utf8_lossy(&unmount.stderr)
        );
        let cut = Command::new(python())
            .arg(SCRIPT)
            .arg("cut")
            .arg(self.dir.path().join("state"))
            .arg("--verbose")
            .output()
            .expect("run power_loss_fs.py cut");
        let summary = String::from_utf8_lossy(&cut.stderr);
        assert!(
            cut.status.success(),
            "power_loss_fs.py cut failed: {summary}"
        );
        eprint!("{summary}");
        self.child = spawn(self.dir.path());
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PowerLossFs {
    fn drop(&mut self) {
        self.kill();
        let _ = unmount(&self.mount);
    }
}

/// Starts `power_loss_fs.py mount DIR/state DIR/mnt` and waits for its `mounted` line.
fn spawn(dir: &Path) -> Child {
    let log_path = dir.join("fs.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .expect("open fs.log");
    let mut child = Command::new(python())
        .arg(SCRIPT)
        .arg("mount")
        .arg(dir.join("state"))
        .arg(dir.join("mnt"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start power_loss_fs.py");
    let stdout = child.stdout.take().expect("stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(read.map(|_| line));
    });
    match receiver.recv_timeout(MOUNT_TIMEOUT) {
        Ok(Ok(line)) if line == "mounted\n" => child,
        outcome => {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = fs::read_to_string(&log_path).unwrap_or_default();
            panic!(
                "power_loss_fs.py did not mount {} ({outcome:?}); its stderr:\n{stderr}",
                dir.join("mnt").display()
            );
        }
    }
}

fn unmount(mount: &Path) -> std::process::Output {
    Command::new("umount")
        .arg("-l")
        .arg(mount)
        .output()
        .expect("run umount")
}

/// Everything under `root`, by relative path: a file with its contents, a directory as
/// `path/` with none.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(root.join(&dir)).expect("read_dir") {
            let path = dir.join(entry.expect("dir entry").file_name());
            let name = path.to_string_lossy().into_owned();
            if root.join(&path).is_dir() {
                found.insert(format!("{name}/"), String::new());
                dirs.push(path);
            } else {
                let contents = fs::read(root.join(&path)).expect("read");
                found.insert(name, String::from_utf8_lossy(&contents).into_owned());
            }
        }
    }
    found
}

/// `(path, contents)` pairs as [`tree`] lists them.
fn listing(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(path, contents)| (path.to_string(), contents.to_string()))
        .collect()
}

/// Cuts the power and asserts the mount then holds exactly `expected`.
fn cut_keeps(fs: &mut PowerLossFs, expected: &[(&str, &str)]) {
    fs.power_cut();
    assert_eq!(tree(fs.path()), listing(expected));
}

/// Makes `change` in the mount's root and cuts the power: the change is undone (the
/// mount holds `before`). Makes it again, fsyncs the root and cuts: it sticks (`after`).
fn sticks_once_the_root_is_synced(
    fs: &mut PowerLossFs,
    change: impl Fn(&Path),
    before: &[(&str, &str)],
    after: &[(&str, &str)],
) {
    let root = fs.path().to_path_buf();
    change(&root);
    cut_keeps(fs, before);
    change(&root);
    sync_dir(&root);
    cut_keeps(fs, after);
}

/// Creates (or truncates) the file `path` with `contents` and fsyncs it, not its
/// directory.
fn write_synced(path: &Path, contents: &str) {
    let mut file = File::create(path).expect("create");
    file.write_all(contents.as_bytes()).expect("write");
    file.sync_all().expect("fsync");
}

/// Appends `contents` to the file `path`, unsynced; returns the file to sync it by.
fn append(path: &Path, contents: &str) -> File {
    let mut file = OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open to append");
    file.write_all(contents.as_bytes()).expect("append");
    file
}

/// A fresh mount holding one durable file, `f`, with `contents`; and its path.
fn mount_with_file(contents: &str) -> (PowerLossFs, PathBuf) {
    let fs = PowerLossFs::mount();
    let f = fs.path().join("f");
    write_synced(&f, contents);
    sync_dir(fs.path());
    (fs, f)
}

/// fsyncs the directory `dir`.
fn sync_dir(dir: &Path) {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .expect("fsync a directory");
}

#[test]
fn synced_data_and_names_survive_a_cut() {
    let mut fs = PowerLossFs::mount();
    let root = fs.path().to_path_buf();
    fs::create_dir(root.join("d")).expect("mkdir");
    sync_dir(&root);
    write_synced(&root.join("d/f"), "hello");
    sync_dir(&root.join("d"));
    write_synced(&root.join("g"), "world");
    sync_dir(&root);
    cut_keeps(&mut fs, &[("d/", ""), ("d/f", "hello"), ("g", "world")]);

    // What survived is the new starting point: synced changes to it survive the next cut.
    append(&root.join("g"), "!").sync_data().expect("fdatasync");
    cut_keeps(&mut fs, &[("d/", ""), ("d/f", "hello"), ("g", "world!")]);
}

#[test]
fn unsynced_appends_are_lost() {
    let (mut fs, f) = mount_with_file("abc");
    append(&f, "def").sync_data().expect("fdatasync");
    append(&f, "ghi");
    assert_eq!(fs::read_to_string(&f).expect("read"), "abcdefghi");
    cut_keeps(&mut fs, &[("f", "abcdef")]);
}

#[test]
fn an_unsynced_overwrite_is_undone_and_any_handle_syncs_it() {
    let (mut fs, f) = mount_with_file("aaaaaaaa");
    let writer = OpenOptions::new().write(true).open(&f).expect("open");
    writer.write_all_at(b"XY", 2).expect("overwrite");
    drop(writer);
    cut_keeps(&mut fs, &[("f", "aaaaaaaa")]);

    // An fsync through another handle, read-only, makes the overwrite durable.
    let writer = OpenOptions::new().write(true).open(&f).expect("open");
    writer.write_all_at(b"XY", 2).expect("overwrite");
    File::open(&f).and_then(|f| f.sync_all()).expect("fsync");
    drop(writer);
    cut_keeps(&mut fs, &[("f", "aaXYaaaa")]);
}

#[test]
fn an_unsynced_truncation_is_undone() {
    let (mut fs, f) = mount_with_file("0123456789");
    let file = OpenOptions::new().write(true).open(&f).expect("open");
    file.set_len(3).expect("ftruncate");
    drop(file);
    cut_keeps(&mut fs, &[("f", "0123456789")]);

    // An O_TRUNC open and a rewrite that leaves a gap: undone unsynced; synced, the
    // old bytes are gone from the gap too.
    let rewrite = || {
        let file = File::create(&f).expect("open with O_TRUNC");
        file.write_all_at(b"new", 8).expect("write");
        file
    };
    drop(rewrite());
    cut_keeps(&mut fs, &[("f", "0123456789")]);
    rewrite().sync_all().expect("fsync");
    cut_keeps(&mut fs, &[("f", "\0\0\0\0\0\0\0\0new")]);

    // Shrunk and grown again, then synced: the old bytes past the cut stay gone.
    let file = OpenOptions::new().write(true).open(&f).expect("open");
    file.set_len(1).expect("ftruncate");
    file.set_len(4).expect("ftruncate");
    file.write_all_at(b"z", 5).expect("write");
    file.sync_all().expect("fsync");
    cut_keeps(&mut fs, &[("f", "\0\0\0\0\0z")]);

    // Emptied and grown back as a hole of whole blocks: the durable bytes are zeroed.
    let file = OpenOptions::new().write(true).open(&f).expect("open");
    file.write_all_at(&[b'x'; 1 << 16], 0).expect("write");
    file.sync_all().expect("fsync");
    file.set_len(0).expect("ftruncate");
    file.set_len(1 << 16).expect("ftruncate");
    file.sync_all().expect("fsync");
    cut_keeps(&mut fs, &[("f", &"\0".repeat(1 << 16))]);
}

#[test]
fn a_synced_file_in_an_unsynced_directory_is_gone() {
    let mut fs = PowerLossFs::mount();
    write_synced(&fs.path().join("f"), "synced data, unsynced name");
    cut_keeps(&mut fs, &[]);
}

#[test]
fn a_durable_name_of_an_unsynced_file_comes_back_empty() {
    let mut fs = PowerLossFs::mount();
    let mut file = File::create(fs.path().join("f")).expect("create");
    file.write_all(b"never synced").expect("write");
    sync_dir(fs.path());
    cut_keeps(&mut fs, &[("f", "")]);
}

#[test]
fn a_rename_sticks_only_after_its_directory_is_synced() {
    let (mut fs, _) = mount_with_file("contents");
    let rename = |root: &Path| fs::rename(root.join("f"), root.join("g")).expect("rename");
    sticks_once_the_root_is_synced(&mut fs, rename, &[("f", "contents")], &[("g", "contents")]);

    // The atomic replacement: a synced temporary file renamed over the target.
    let replace = |root: &Path| {
        write_synced(&root.join("g.tmp"), "replaced");
        fs::rename(root.join("g.tmp"), root.join("g")).expect("rename");
    };
    sticks_once_the_root_is_synced(&mut fs, replace, &[("g", "contents")], &[("g", "replaced")]);
}

#[test]
fn a_rename_across_directories_needs_both_synced() {
    let mut fs = PowerLossFs::mount();
    let root = fs.path().to_path_buf();
    for dir in ["from", "to"] {
        fs::create_dir(root.join(dir)).expect("mkdir");
        sync_dir(&root.join(dir));
    }
    sync_dir(&root);
    write_synced(&root.join("from/f"), "moving");
    sync_dir(&root.join("from"));
    fs::rename(root.join("from/f"), root.join("to/f")).expect("rename");
    sync_dir(&root.join("to"));
    // Only the target's side was synced: the file is under both names.
    cut_keeps(
        &mut fs,
        &[
            ("from/", ""),
            ("from/f", "moving"),
            ("to/", ""),
            ("to/f", "moving"),
        ],
    );

    fs::remove_file(root.join("from/f")).expect("unlink");
    sync_dir(&root.join("from"));
    cut_keeps(&mut fs, &[("from/", ""), ("to/", ""), ("to/f", "moving")]);
}

#[test]
fn an_unlink_sticks_only_after_its_directory_is_synced() {
    let (mut fs, _) = mount_with_file("kept");
    let unlink = |root: &Path| fs::remove_file(root.join("f")).expect("unlink");
    sticks_once_the_root_is_synced(&mut fs, unlink, &[("f", "kept")], &[]);
}

#[test]
fn a_directory_needs_its_parent_synced_and_itself_for_its_entries() {
    let mut fs = PowerLossFs::mount();
    let root = fs.path().to_path_buf();
    fs::create_dir_all(root.join("d/e")).expect("mkdir");
    write_synced(&root.join("d/e/f"), "deep");
    sync_dir(&root.join("d/e"));
    sync_dir(&root.join("d"));
    cut_keeps(&mut fs, &[]);

    // Its entry synced, but not its own entries: an empty directory.
    fs::create_dir_all(root.join("d")).expect("mkdir");
    write_synced(&root.join("d/f"), "lost");
    sync_dir(&root);
    cut_keeps(&mut fs, &[("d/", "")]);

    fs::remove_dir(root.join("d")).expect("rmdir");
    sync_dir(&root);
    cut_keeps(&mut fs, &[]);
}

#[test]
fn a_reused_inode_does_not_mix_contents() {
    let (mut fs, _) = mount_with_file("old contents");
    // The backing file system likely gives the new file the old one's inode number.
    let replace = |root: &Path| {
        fs::remove_file(root.join("f")).expect("unlink");
        write_synced(&root.join("g"), "new");
    };
    sticks_once_the_root_is_synced(&mut fs, replace, &[("f", "old contents")], &[("g", "new")]);
}

#[test]
fn a_remount_reads_exactly_the_durable_state() {
    let mut fs = PowerLossFs::mount();
    let root = fs.path().to_path_buf();
    let big = root.join("big");
    // Data, a hole, data: 300 KiB, synced.
    let file = File::create(&big).expect("create");
    let head: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    file.write_all_at(&head, 0).expect("write");
    file.write_all_at(b"tail", 5 << 20)
        .expect("write past a hole");
    file.sync_all().expect("fsync");
    sync_dir(&root);
    // Unsynced: bytes in the hole, in the head, and past the end.
    file.write_all_at(b"in the hole", 1 << 20).expect("write");
    file.write_all_at(b"head", 100).expect("write");
    file.write_all_at(b"more", 6 << 20).expect("write");
    drop(file);
    for name in ["x", "y", "z"] {
        write_synced(&root.join(name), name);
    }
    sync_dir(&root);
    append(&root.join("y"), " unsynced");
    write_synced(&root.join("unnamed"), "");
    fs.power_cut();

    let mut expected = head;
    expected.resize((5 << 20) + 4, 0);
    expected[5 << 20..].copy_from_slice(b"tail");
    assert!(
        fs::read(&big).expect("read") == expected,
        "big reads as synced: data, a hole, data"
    );
    let mut found = tree(&root);
    found.remove("big");
    assert_eq!(found, listing(&[("x", "x"), ("y", "y"), ("z", "z")]));
}

#[test]
fn sqlite_in_wal_mode_keeps_every_committed_row() {
    // Commits `rows` rows one transaction each and exits without closing, as a crash
    // would; prints the rows it then counts and the integrity check.
    const COMMITS: &str = r#"
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
for _ in range(int(sys.argv[2])):
    db.execute("INSERT INTO t (v) VALUES ('row')")
count = db.execute("SELECT count(*) FROM t").fetchone()[0]
check = db.execute("PRAGMA integrity_check").fetchone()[0]
print(count, check, flush=True)
os._exit(0)
"#;
    let mut fs = PowerLossFs::mount();
    let db = fs.path().join("db.sqlite");
    let run = |rows: u32| {
        let output = Command::new(python())
            .args(["-c", COMMITS])
            .arg(&db)
            .arg(rows.to_string())
            .output()
            .expect("run python");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "sqlite3 failed: {stderr}");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(run(40), "40 ok");
    fs.power_cut();
    assert_eq!(run(25), "65 ok");
    fs.power_cut();
    assert_eq!(run(0), "65 ok");
}
