//! The topic table on disk: `DATA/topics.json`, written atomically (compact: core 0 writes it
//! whole at every change).

use crate::table::TopicTable;
use shards::files::write_atomically;
use std::path::Path;

fn table_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("topics.json")
}

pub(super) async fn persist_table(data_dir: &Path, table: &TopicTable) -> std::io::Result<()> {
    let path = table_path(data_dir);
    let bytes = serde_json::to_vec(table).map_err(std::io::Error::other)?;
    glommio::executor()
        .spawn_blocking(move || write_atomically(&path, &bytes))
        .await
}

/// Reads the persisted table at start-up (blocking is fine then).
pub fn load_table(data_dir: &Path) -> std::io::Result<TopicTable> {
    match std::fs::read(table_path(data_dir)) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| std::io::Error::other(format!("topics.json: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopicTable::default()),
        Err(e) => Err(e),
    }
}
