use super::*;

#[test]
fn in_shared_folders_a_page_unreadable_or_of_a_changed_length_is_a_miss_and_a_timeout_is_not() {
    let key = PageKey::new("k").unwrap();
    let io = TierError::Io {
        op: "read",
        key: Some(key.clone()),
        path: None,
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    let short = TierError::LengthMismatch {
        key,
        stored: 0,
        buffer: 65536,
    };
    assert!(missed_in_shared_folders(&io));
    assert!(
        missed_in_shared_folders(&short),
        "a page another client shows short is a miss, not an error"
    );
    let slow = TierError::Timeout {
        op: "file read",
        after: std::time::Duration::from_secs(1),
    };
    assert!(!missed_in_shared_folders(&slow));
}
