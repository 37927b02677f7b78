//! A crafted file tree (a fake `/sys` and `/proc`) under a fresh temporary
//! folder, for the unit tests of what reads the kernel's files.

use std::path::PathBuf;

/// A folder `kml-<name>-<pid>-<thread>` in the temporary folder, emptied
/// when made and removed on drop.
pub(crate) struct Tree(pub(crate) PathBuf);

impl Tree {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kml-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Writes `content` to `rel`, making its folders.
    pub(crate) fn file(&self, rel: &str, content: &str) -> &Self {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
        self
    }

    /// What `rel` holds, trimmed.
    pub(crate) fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.0.join(rel))
            .unwrap()
            .trim()
            .to_owned()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
