//! Answers that page themselves below governance's truncation: a listing whose JSON would
//! pass [`ANSWER_BYTES`] keeps only the items that fit and says how many it left out.
//!
//! Truncation cuts an answer's text whole, so a listing past it lost the structured
//! content its output schema promises, and MCP clients that check the schema (the official
//! Python SDK) then failed the call. A listing kept within the limit stays valid JSON of its
//! schema, with fewer items and a count of the rest.

use serde::Serialize;

/// Bytes of items one listing answers with at most: under governance's default truncation
/// of 50 KiB (`[truncate] max_bytes`), with room for the rest of the answer.
pub const ANSWER_BYTES: usize = 40 * 1024;

/// Which items a listing keeps when they do not all fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The first ones (a page read on from where it ended).
    First,
    /// The last ones (the latest of a history).
    Last,
}

/// `items` cut to those whose compact JSON fits in `budget` bytes together (always at
/// least one: a single item past the budget is the truncation's to cut), and how many were
/// left out. Items are measured as they would be written, without being written anywhere,
/// and only until the budget is spent.
pub fn within<T: Serialize>(mut items: Vec<T>, budget: usize, keep: Keep) -> (Vec<T>, usize) {
    let total = items.len();
    let fit = match keep {
        Keep::First => fitting(items.iter(), budget),
        Keep::Last => fitting(items.iter().rev(), budget),
    };
    match keep {
        Keep::First => items.truncate(fit),
        Keep::Last => drop(items.drain(..total - fit)),
    }
    (items, total - fit)
}

/// How many of `items`, in order, fit in `budget` bytes of compact JSON (at least one).
fn fitting<'a, T: Serialize + 'a>(items: impl Iterator<Item = &'a T>, budget: usize) -> usize {
    let mut used = 0;
    let mut fit = 0;
    for item in items {
        // The comma or bracket beside it, and the item.
        let size = 1 + json_len(item);
        if fit > 0 && used + size > budget {
            break;
        }
        used += size;
        fit += 1;
    }
    fit
}

/// The length of `value` as compact JSON, counted without building it. A value JSON
/// cannot hold counts only what was written before it failed: an answer would fail on it
/// too, and is the one to refuse it.
pub fn json_len(value: &(impl Serialize + ?Sized)) -> usize {
    let mut count = Counted(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Bytes written to it, counted and dropped.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether a count of items left out is zero (`skip_serializing_if` of the answers'
/// `left_out`).
pub fn none_left(left_out: &usize) -> bool {
    *left_out == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_keeps_what_fits_from_the_end_it_reads_from() {
        let items: Vec<String> = (0..10).map(|i| format!("{i}{}", "x".repeat(98))).collect();
        let (first, left) = within(items.clone(), 350, Keep::First);
        assert_eq!((first.len(), left), (3, 7));
        assert!(first[0].starts_with('0'));
        let (last, left) = within(items.clone(), 350, Keep::Last);
        assert_eq!((last.len(), left), (3, 7));
        assert!(last[2].starts_with('9'));
        let (one, left) = within(items, 10, Keep::First);
        assert_eq!((one.len(), left), (1, 9), "one item always");
    }
}
