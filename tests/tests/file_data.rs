//! file_data on the running kernel: files the test creates with known names
//! (short, long, and longer than the name buffer) and known sizes show up
//! with their full names, their inode numbers (checked against
//! `std::fs::metadata`) and, on the re-open, their sizes.

use std::{io::Write, os::unix::fs::MetadataExt, path::PathBuf};

use arrow_array::{cast::AsArray, RecordBatch};
use kernmlops_e2e::*;

/// Bytes of a name the table keeps (the buffer, less its NUL).
const NAME_KEEP: usize = 255;

fn column_bool(batches: &[RecordBatch], name: &str) -> Vec<bool> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no column {name}"));
            col.as_boolean()
                .iter()
                .map(|v| v.unwrap_or(false))
                .collect::<Vec<_>>()
        })
        .collect()
}

struct Expected {
    path: PathBuf,
    size: u64,
    ino: u64,
}

#[test]
fn root_file_data_sees_names_sizes_and_inodes() {
    if !require_root("root_file_data_sees_names_sizes_and_inodes") {
        return;
    }
    let _serial = serial();
    let plugins = plugin_dir("file-data", &[("file_data", "file_data")]);
    let output = temp_dir("file-data-out");
    let files = temp_dir("file-data-files");
    let dir_len = files.as_os_str().len();
    // Names of 5, 40 and 120 bytes, one whose full path is exactly the 255
    // bytes kept, and one whose path is longer (its row is cut).
    let lengths = [5, 40, 120, NAME_KEEP - dir_len - 1, 250];
    let paths: Vec<PathBuf> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let stem = i.to_string();
            files.join(format!("{stem}{}", "f".repeat(len - stem.len())))
        })
        .collect();

    let c = Collector::start(&[
        "--plugin-dir",
        plugins.to_str().expect("utf8"),
        "--plugins",
        "file_data",
        "--tgid",
        &std::process::id().to_string(),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    let mut expected = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let size = 1000 * i as u64 + 7;
        let mut f = std::fs::File::create(path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        f.write_all(&vec![b'k'; size as usize]).expect("writing");
        drop(f);
        // Opened again for reading: this open sees the size.
        drop(std::fs::File::open(path).expect("re-opening"));
        let ino = std::fs::metadata(path).expect("metadata").ino();
        expected.push(Expected {
            path: path.clone(),
            size,
            ino,
        });
    }
    let done = c.signal_and_wait(libc::SIGINT);
    assert!(done.status.success(), "kernmlops failed:\n{}", done.stderr);
    let dir = done.dir.expect("collection folder printed");

    let batches = read_table(&dir.join("file_data.arrow"));
    let names = column_str(&batches, "name");
    let kinds = column_str(&batches, "open_kind");
    let inodes = column_u64(&batches, "inode");
    let sizes = column_u64(&batches, "size_bytes");
    let tgids = column_u64(&batches, "tgid");
    let truncated = column_bool(&batches, "name_truncated");
    assert!(
        tgids.iter().all(|&t| t == u64::from(std::process::id())),
        "--tgid let other processes through"
    );

    for e in &expected {
        let full = e.path.to_str().expect("utf8");
        let (want, cut) = if full.len() > NAME_KEEP {
            (&full[..NAME_KEEP], true)
        } else {
            (full, false)
        };
        let rows: Vec<usize> = (0..names.len())
            .filter(|&i| names[i].as_deref() == Some(want))
            .collect();
        let kinds_seen: Vec<&str> = rows.iter().filter_map(|&i| kinds[i].as_deref()).collect();
        assert!(
            kinds_seen.contains(&"create") && kinds_seen.contains(&"open"),
            "{full} ({} bytes): want a create and an open row, got {kinds_seen:?}",
            full.len()
        );
        for &i in &rows {
            assert_eq!(truncated[i], cut, "{full}: name_truncated");
            assert_eq!(inodes[i], e.ino, "{full}: inode vs metadata");
            if kinds[i].as_deref() == Some("open") {
                assert_eq!(sizes[i], e.size, "{full}: size on re-open");
            } else {
                assert_eq!(sizes[i], 0, "{full}: size after create (O_TRUNC)");
            }
        }
    }
    let man = manifest(&dir);
    assert_eq!(man["tables"]["file_data"]["lost_events"], 0, "lost events");
    let _ = std::fs::remove_dir_all(&files);
}
