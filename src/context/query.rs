//! Reading a context: by keys, by key prefix, everything, or ranked by relevance (BM25).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{Entry, SessionContext};

/// Which entries to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Select {
    /// Every entry, by key.
    All,
    /// These keys, in the order given; keys without an entry are listed as missing.
    Keys(Vec<String>),
    /// The entries whose key starts with this, by key.
    Prefix(String),
    /// The entries most relevant to this text (BM25 over keys and text in values), best
    /// first; entries sharing no term with it are left out.
    Relevant(String),
}

/// What a read found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ContextView {
    /// The session version read.
    pub version: u64,
    /// The entries, in the order the selection gives (at most `limit`).
    pub entries: Vec<Entry>,
    /// With [`Select::Relevant`], each entry's score, in the same order; otherwise empty.
    pub scores: Vec<f64>,
    /// How many entries matched, before the limit.
    pub total: usize,
    /// With [`Select::Keys`], the keys that have no entry.
    pub missing: Vec<String>,
}

/// Reads `select` from `ctx`, at most `limit` entries.
pub(crate) fn read(ctx: &SessionContext, select: &Select, limit: usize) -> ContextView {
    let mut view = ContextView {
        version: ctx.version(),
        entries: Vec::new(),
        scores: Vec::new(),
        total: 0,
        missing: Vec::new(),
    };
    match select {
        Select::All => take(&mut view, ctx.entries(), limit),
        Select::Prefix(prefix) => take(&mut view, ctx.with_prefix(prefix), limit),
        Select::Keys(keys) => {
            let mut found = Vec::with_capacity(keys.len());
            for key in keys {
                match ctx.get(key) {
                    Some(entry) => found.push(entry),
                    None => view.missing.push(key.clone()),
                }
            }
            take(&mut view, found.into_iter(), limit);
        }
        Select::Relevant(query) => {
            let ranked = rank(ctx, query);
            view.total = ranked.len();
            for (score, entry) in ranked.into_iter().take(limit) {
                view.entries.push(entry.clone());
                view.scores.push(score);
            }
        }
    }
    view
}

fn take<'a>(view: &mut ContextView, entries: impl Iterator<Item = &'a Entry>, limit: usize) {
    for entry in entries {
        if view.entries.len() < limit {
            view.entries.push(entry.clone());
        }
        view.total += 1;
    }
}

/// BM25 parameters: the usual ones.
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Lower-cased runs of letters and digits.
fn tokens(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
}

/// Every piece of text in a value: strings, object keys, numbers and booleans.
fn visit_text(value: &Value, visit: &mut impl FnMut(&str)) {
    match value {
        Value::Null => {}
        Value::Bool(b) => visit(if *b { "true" } else { "false" }),
        Value::Number(n) => visit(&n.to_string()),
        Value::String(s) => visit(s),
        Value::Array(items) => items.iter().for_each(|v| visit_text(v, visit)),
        Value::Object(map) => {
            for (k, v) in map {
                visit(k);
                visit_text(v, visit);
            }
        }
    }
}

/// Entries scored by BM25 against `query`, best first (ties by key); zero scores left out.
fn rank<'a>(ctx: &'a SessionContext, query: &str) -> Vec<(f64, &'a Entry)> {
    let mut terms: Vec<String> = tokens(query).collect();
    terms.sort();
    terms.dedup();
    if terms.is_empty() || ctx.is_empty() {
        return Vec::new();
    }
    // Per entry: its length in tokens and how often each query term occurs in it.
    let mut docs: Vec<(&Entry, usize, Vec<u32>)> = Vec::with_capacity(ctx.len());
    let mut df = vec![0usize; terms.len()];
    for entry in ctx.entries() {
        let mut len = 0;
        let mut tf = vec![0u32; terms.len()];
        let mut count = |text: &str| {
            for token in tokens(text) {
                len += 1;
                if let Ok(i) = terms.binary_search(&token) {
                    tf[i] += 1;
                }
            }
        };
        count(&entry.key);
        visit_text(&entry.value, &mut count);
        for (i, n) in tf.iter().enumerate() {
            if *n > 0 {
                df[i] += 1;
            }
        }
        docs.push((entry, len, tf));
    }
    let n = docs.len() as f64;
    let avg_len = (docs.iter().map(|d| d.1).sum::<usize>() as f64 / n).max(1.0);
    let idf: Vec<f64> = df
        .iter()
        .map(|&df| (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln())
        .collect();
    let mut ranked: Vec<(f64, &Entry)> = docs
        .into_iter()
        .filter_map(|(entry, len, tf)| {
            let norm = K1 * (1.0 - B + B * len as f64 / avg_len);
            let score: f64 = tf
                .iter()
                .zip(&idf)
                .filter(|(tf, _)| **tf > 0)
                .map(|(&tf, idf)| idf * f64::from(tf) * (K1 + 1.0) / (f64::from(tf) + norm))
                .sum();
            (score > 0.0).then_some((score, entry))
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.key.cmp(&b.1.key)));
    ranked
}
