//! What the groups' unit tests share: the executor they run on (`shards::testing::run`) and a
//! small tail cache for stores.

use std::rc::Rc;

pub use shards::testing::run;

/// A tail cache for an offsets store under test.
pub fn cache() -> Rc<shards::TailCache> {
    Rc::new(shards::TailCache::new(1 << 20, 1 << 16))
}
