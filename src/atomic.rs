//! Files written whole. Every file fact writes for a user or a later run (the composed module,
//! the op library, compose's and bench's reports, the sweeps' records, the pattern tables, the
//! build cache's objects) is written under its own name in a fresh folder beside its place, flushed
//! to the disk, and renamed into place; the folder is removed. A reader, or a run after fact was
//! killed at any point, finds the previous complete file or none, never a torn one; a process that
//! loaded the previous library keeps it (the rename replaces the name, not the file). The file
//! keeps its own name while it is written because writers record it: torch names a saved module's
//! archive folder after its file.
//!
//! A write whose writer fails leaves the previous file and removes what it wrote. The killed-save
//! test stops the process inside a write with `FACT_TEST_KILL_WRITING` (`KILL_WRITING`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Names a file (`composed.pt`): a write of a file of that name aborts the process after its
/// writer finished, its file cut to half its length, before the rename: as a kill in the middle
/// of the save leaves it. For the test that kills a compose while it saves.
pub const KILL_WRITING: &str = "FACT_TEST_KILL_WRITING";

/// Writes `bytes` to `path` whole.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> io::Result<()> {
    write_with(path, |tmp| fs::write(tmp, bytes.as_ref()), |e| e)
}

/// Has `make` write the file at a path it is given (of `path`'s name, in a folder beside it), then
/// puts that file at `path` whole; `io` makes the caller's error of a failure to do so. What `make`
/// returns is returned; where it fails, its file is removed and `path` left as it was.
pub fn write_with<T, E>(
    path: &Path,
    make: impl FnOnce(&Path) -> Result<T, E>,
    io: impl FnOnce(io::Error) -> E,
) -> Result<T, E> {
    let dir = match temp_dir(path) {
        Ok(dir) => dir,
        Err(e) => return Err(io(e)),
    };
    let tmp = dir.join(path.file_name().unwrap_or(path.as_os_str()));
    let made = make(&tmp).and_then(|out| match put(&tmp, path) {
        Ok(()) => Ok(out),
        Err(e) => Err(io(e)),
    });
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&dir);
    made
}

/// A new folder beside `path` that no other writer uses, in this process or another (compose
/// builds on several threads, and two of them may write one cached object).
fn temp_dir(path: &Path) -> io::Result<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = path.with_file_name(format!(".{name}.tmp{}-{n}", std::process::id()));
    fs::create_dir(&dir)?;
    Ok(dir)
}

/// Flushes `tmp` to the disk and renames it to `path`, then flushes `path`'s folder (its entry).
fn put(tmp: &Path, path: &Path) -> io::Result<()> {
    killed_here(tmp, path);
    File::open(tmp)?.sync_all()?;
    fs::rename(tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Not every file system lets a folder be opened to flush it; the rename stands either way.
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// `KILL_WRITING`'s stop, where it names `path`'s file.
fn killed_here(tmp: &Path, path: &Path) {
    let Some(name) = std::env::var_os(KILL_WRITING) else {
        return;
    };
    if path.file_name() != Some(name.as_os_str()) {
        return;
    }
    if let Ok(f) = OpenOptions::new().write(true).open(tmp) {
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = f.set_len(len / 2);
        let _ = f.sync_all();
    }
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compose.json");
        write(&path, "first").unwrap();
        write(&path, "second, longer").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "second, longer");
        assert_eq!(names(dir.path()), ["compose.json"]);
    }

    #[test]
    fn the_writer_writes_under_the_files_own_name_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("composed.pt");
        let seen = write_with(
            &path,
            |tmp| {
                assert!(
                    !path.exists(),
                    "nothing is in place before the writer is done"
                );
                fs::write(tmp, "module")?;
                Ok::<_, io::Error>(tmp.to_path_buf())
            },
            |e| e,
        )
        .unwrap();
        assert_eq!(seen.file_name(), path.file_name());
        assert_eq!(seen.parent().unwrap().parent(), Some(dir.path()));
        assert_eq!(fs::read_to_string(&path).unwrap(), "module");
        assert_eq!(names(dir.path()), ["composed.pt"]);
    }

    #[test]
    fn a_failing_writer_leaves_the_previous_file_and_removes_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libfact_ops.so");
        write(&path, "previous library").unwrap();
        let err = write_with(
            &path,
            |tmp| {
                fs::write(tmp, "half a libr")?;
                Err::<(), _>(io::Error::other("the linker failed"))
            },
            |e| e,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "the linker failed");
        assert_eq!(fs::read_to_string(&path).unwrap(), "previous library");
        assert_eq!(names(dir.path()), ["libfact_ops.so"]);
    }

    #[test]
    fn a_loaded_file_keeps_its_contents_when_a_new_one_takes_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libfact_ops.so");
        write(&path, "old").unwrap();
        let open = File::open(&path).unwrap();
        write(&path, "new").unwrap();
        let mut old = String::new();
        io::Read::read_to_string(&mut &open, &mut old).unwrap();
        assert_eq!(
            (old.as_str(), fs::read_to_string(&path).unwrap().as_str()),
            ("old", "new")
        );
    }
}
