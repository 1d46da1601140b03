//! Pagination of list results: the cursor is the offset of the next page.

use rmcp::ErrorData as McpError;
use rmcp::model::PaginatedRequestParams;

/// Items per page of a list result.
pub(super) const PAGE: usize = 100;

/// The page of `items` the request's cursor asks for, and the cursor of the next page when
/// there is one. A cursor that is not an offset inside the list is `-32602`.
pub(super) fn page<T>(
    mut items: Vec<T>,
    request: Option<PaginatedRequestParams>,
) -> Result<(Vec<T>, Option<String>), McpError> {
    let total = items.len();
    let start = match request.and_then(|r| r.cursor) {
        None => 0,
        Some(cursor) => cursor
            .parse::<usize>()
            .ok()
            .filter(|&at| at > 0 && at < total)
            .ok_or_else(|| McpError::invalid_params(format!("invalid cursor `{cursor}`"), None))?,
    };
    let end = (start + PAGE).min(total);
    let next = (end < total).then(|| end.to_string());
    Ok((items.drain(start..end).collect(), next))
}
