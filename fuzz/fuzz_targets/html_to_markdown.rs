//! Any bytes as a fetched page: converted to Markdown, or to its text past the depth
//! bound, never a panic and never a stack overflow (3,000 nested `<div>`s once aborted the
//! server). Run on a thread with the stack `web_fetch` gives the conversion.
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
    assert_eq!(converted.as_text, converted.depth > html::MAX_DEPTH);
});
