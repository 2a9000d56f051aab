//! A command's answer, printed as tables for people or as one JSON document for scripts.

use super::args::Format;
use serde_json::Value;

/// Rows under a header, with an optional title line above them.
#[derive(Debug)]
pub struct Table {
    pub title: Option<String>,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: Option<String>, header: Vec<&'static str>) -> Table {
        Table {
            title,
            header,
            rows: Vec::new(),
        }
    }

    fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_string() + "\n"
        };
        let mut out = self
            .title
            .as_ref()
            .map_or(String::new(), |t| format!("{t}\n"));
        if self.header.is_empty() {
            // Lines of text rather than columns.
            return out
                + &self
                    .rows
                    .iter()
                    .map(|r| r.join("  ") + "\n")
                    .collect::<String>();
        }
        out += &line(self.header.clone());
        for row in &self.rows {
            out += &line(row.iter().map(String::as_str).collect());
        }
        out
    }
}

/// What a command prints: the same answer as tables and as JSON.
#[derive(Debug)]
pub struct Report {
    pub tables: Vec<Table>,
    pub json: Value,
}

impl Report {
    pub fn print(&self, format: Format) {
        match format {
            Format::Json => println!("{}", self.json),
            Format::Table => {
                let parts: Vec<String> = self.tables.iter().map(Table::render).collect();
                print!("{}", parts.join("\n"));
            }
        }
    }
}

/// A one-line answer, as a table of one row and as JSON.
pub fn done(what: String, json: serde_json::Value) -> Report {
    let mut t = Table::new(None, Vec::new());
    t.rows.push(vec![what]);
    Report {
        tables: vec![t],
        json,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned() {
        let mut t = Table::new(Some("topic t".into()), vec!["PARTITION", "LEADER"]);
        t.rows.push(vec!["0".into(), "12".into()]);
        t.rows.push(vec!["10".into(), "3".into()]);
        assert_eq!(
            t.render(),
            "topic t\nPARTITION  LEADER\n0          12\n10         3\n"
        );
        let mut lines = Table::new(None, Vec::new());
        lines.rows.push(vec!["deleted topic t".into()]);
        assert_eq!(lines.render(), "deleted topic t\n");
    }
}
