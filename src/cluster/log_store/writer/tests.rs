//! Reading live ranges of a log file back whole, and appending a range while catching up.

use super::*;

/// A log file of `len` bytes where byte `i` is `i % 251`, in a fresh directory.
fn file(len: usize) -> (PathBuf, Vec<u8>) {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "bucketd-writer-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    fs::write(dir.join(LOG_FILE), &bytes).unwrap();
    (dir, bytes)
}

#[test]
fn only_live_ranges_are_read_and_each_record_comes_back_whole() {
    let (dir, bytes) = file(1 << 20);
    let mut index = DiskIndex::default();
    // Two groups' records close together, one far away, one at the very end.
    index.entry(1, 1, 100, 20);
    index.entry(2, 1, 130, 50);
    index.entry(1, 2, 400_000, 64);
    index.entry(2, 2, (1 << 20) - 10, 10);
    let live = LiveBytes::read(&dir, &index).unwrap();
    assert_eq!(live.parts.len(), 3, "far-apart records are read apart");
    let read: usize = live.parts.iter().map(|(_, b)| b.len()).sum();
    assert!(read < 1000, "read {read} bytes of a file of 1 MiB");
    for (offset, size) in [(100, 20), (130, 50), (400_000, 64), ((1 << 20) - 10, 10)] {
        let want = &bytes[offset as usize..(offset + size) as usize];
        assert_eq!(live.get(offset, size), Some(want), "record at {offset}");
    }
    assert_eq!(live.get(400_000, 65), None, "past what was read");
    assert_eq!(live.get(50, 10), None, "before anything read");

    let (index2, out) = live_records(&index, &live).unwrap();
    assert_eq!(out.len() as u64, index2.live_bytes);

    // A record the file no longer holds is an error, not a short read.
    index.entry(3, 1, (1 << 20) - 4, 8);
    assert!(LiveBytes::read(&dir, &index).is_err());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn catching_up_appends_the_range_as_it_is() {
    let (dir, bytes) = file(200_000);
    let tmp = dir.join(COMPACT_TMP);
    fs::write(&tmp, b"prefix").unwrap();
    let mut p = Prefix {
        index: DiskIndex::default(),
        len: 6,
        len0: 1000,
        copied_to: 1000,
    };
    catch_up(&dir, &tmp, &mut p, 150_000).unwrap();
    catch_up(&dir, &tmp, &mut p, 200_000).unwrap();
    assert_eq!(p.copied_to, 200_000);
    let got = fs::read(&tmp).unwrap();
    assert_eq!(&got[..6], b"prefix");
    assert!(got[6..] == bytes[1000..], "the copied range differs");
    assert!(
        catch_up(&dir, &tmp, &mut p, 300_000).is_err(),
        "past the end"
    );
    fs::remove_dir_all(&dir).unwrap();
}
