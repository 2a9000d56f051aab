//! A small file a core reads again when it changes: its parsed contents, checked by modification
//! time off the executor thread, the last good contents kept (and the failure logged) when it
//! cannot be read. The users file and the tokens file are kept this way.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::SystemTime;

/// The contents of the file at `path`, as [`Watched::current`] last read them.
#[derive(Debug)]
pub struct Watched<T> {
    path: PathBuf,
    /// What the file is, for the log.
    what: &'static str,
    load: fn(&Path) -> std::io::Result<T>,
    cached: RefCell<(Option<SystemTime>, Rc<T>)>,
}

impl<T: Default + Send + 'static> Watched<T> {
    /// The file at `path`, read by `load` (which answers the empty contents for a missing file).
    pub fn new(path: PathBuf, what: &'static str, load: fn(&Path) -> std::io::Result<T>) -> Self {
        Self {
            path,
            what,
            load,
            cached: RefCell::new((None, Rc::new(T::default()))),
        }
    }

    /// The contents as last read (no read now).
    pub fn last(&self) -> Rc<T> {
        self.cached.borrow().1.clone()
    }

    /// The file it reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The contents as the file holds them now (the last good ones if it cannot be read: logged).
    pub async fn current(&self) -> Rc<T> {
        let (path, load) = (self.path.clone(), self.load);
        let seen = self.cached.borrow().0;
        let loaded = glommio::executor()
            .spawn_blocking(move || {
                let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
                if mtime == seen {
                    return Ok(None);
                }
                load(&path).map(|contents| Some((mtime, contents)))
            })
            .await;
        match loaded {
            Ok(Some((mtime, contents))) => *self.cached.borrow_mut() = (mtime, Rc::new(contents)),
            Ok(None) => {}
            Err(e) => log::error!(
                "cannot read the {} file: {e}; using the last one read",
                self.what
            ),
        }
        self.cached.borrow().1.clone()
    }
}
