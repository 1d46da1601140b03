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
/// left out.
pub fn within<T: Serialize>(mut items: Vec<T>, budget: usize, keep: Keep) -> (Vec<T>, usize) {
    let total = items.len();
    let size = |item: &T| serde_json::to_vec(item).map_or(0, |v| v.len() + 1);
    let mut used = 0;
    let mut fit = 0;
    let order: Box<dyn Iterator<Item = &T>> = match keep {
        Keep::First => Box::new(items.iter()),
        Keep::Last => Box::new(items.iter().rev()),
    };
    for item in order {
        let n = size(item);
        if fit > 0 && used + n > budget {
            break;
        }
        used += n;
        fit += 1;
    }
    match keep {
        Keep::First => items.truncate(fit),
        Keep::Last => {
            items.drain(..total - fit);
        }
    }
    (items, total - fit)
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
