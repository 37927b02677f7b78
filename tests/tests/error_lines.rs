//! Error lines as users read them: an error whose message already quotes
//! its I/O cause says "(os error N)" once, and `repair` refuses a folder
//! that is not a collection without changing anything in it.

use kernmlops_e2e::*;

#[test]
fn an_io_error_is_quoted_once() {
    let out = kernmlops(&["repair", "/nonexistent-kernmlops-folder"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{stderr}");
    assert_eq!(
        errors[0].matches("(os error").count(),
        1,
        "the os error once: {}",
        errors[0]
    );
    assert!(
        errors[0].contains("No such file or directory"),
        "{}",
        errors[0]
    );
}

#[test]
fn repair_refuses_a_folder_that_is_not_a_collection() {
    let dir = temp_dir("repair-not-a-collection");
    std::fs::write(dir.join("empty.arrow"), b"").expect("empty file");
    let out = kernmlops(&["repair", dir.to_str().expect("utf-8")]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{stderr}");
    assert!(
        errors[0].contains("not a collection (no manifest.json)"),
        "{}",
        errors[0]
    );
    assert!(dir.join("empty.arrow").is_file(), "the empty file is kept");
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 1);
}
