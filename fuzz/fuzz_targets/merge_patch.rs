//! Two JSON values, a target and a patch, applied as `replace` then `merge` (RFC 7396) to a
//! session context: applied or refused with an error, never a panic; merging the same patch
//! twice changes nothing the second time.
#![no_main]

use guildhall::context::{Change, ContextLimits, SessionContext, Strategy};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let (Some(Ok(target)), Some(Ok(patch))) = (values.next(), values.next()) else {
        return;
    };
    let limits = ContextLimits::default();
    let mut ctx = SessionContext::new();
    let replace = [Change::new("k", Strategy::Replace, target)];
    if ctx.apply(&replace, None, 0, &limits).is_err() {
        return;
    }
    let merge = [Change::new("k", Strategy::Merge, patch)];
    if ctx.apply(&merge, None, 1, &limits).is_ok() {
        let once = ctx.get("k").map(|e| e.value.clone());
        if ctx.apply(&merge, None, 2, &limits).is_ok() {
            assert_eq!(once, ctx.get("k").map(|e| e.value.clone()), "merge is idempotent");
        }
    }
});
