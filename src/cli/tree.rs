//! Printing a supervision tree.

use std::io::Write;

use guildhall::ChildSnapshot;

/// One line per node: id, kind, status, restarts and breaker, indented by depth.
pub(crate) fn print_tree(
    out: &mut impl Write,
    node: &ChildSnapshot,
    depth: usize,
) -> std::io::Result<()> {
    let breaker = node
        .breaker
        .map(|b| {
            format!(
                ", breaker {}",
                serde_json::to_string(&b).unwrap_or_default()
            )
        })
        .unwrap_or_default();
    writeln!(
        out,
        "{:indent$}{} ({:?}, {:?}, restarts {}{breaker})",
        "",
        node.id,
        node.kind,
        node.status,
        node.restarts,
        indent = depth * 2
    )?;
    for child in &node.children {
        print_tree(out, child, depth + 1)?;
    }
    Ok(())
}
