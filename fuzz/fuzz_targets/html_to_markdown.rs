//! Any bytes as a fetched page: Markdown, or the page's text with a note saying why, never
//! a panic and never a stack overflow (3,000 nested `<div>`s once aborted the server). Run
//! on a thread with the 16 MiB stack `web_fetch` gives the conversion.
#![no_main]

use guildhall::fetch::html;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let page = String::from_utf8_lossy(data).into_owned();
    let converted = std::thread::Builder::new()
        .stack_size(16 * 1024 * 1024)
        .spawn(move || html::convert(&page))
        .expect("a thread")
        .join()
        .expect("the conversion does not panic");
    if converted.depth > html::MAX_DEPTH {
        assert!(converted.note.is_some(), "a page past the bound is its text");
    }
});
