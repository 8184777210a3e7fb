"""Strict validation: every malformed input gets its precise message with file:line and key."""
from __future__ import annotations

import pytest

from smartlaunch.errors import ExitCode, PolicyError
from smartlaunch.policy.load import read_policy_file, validate_file
from smartlaunch.policy.schema import PolicyProblems
from helpers_policy import write

DECISION_KEYS = ("min_efficiency, uncertainty_band, trials, trial_steps, trial_seconds, prestart, allowed_strategies, "
                 "max_gpus, world_sizes, ddp_link_classes, prefer_independent_for_sweeps, memory_headroom, "
                 "avoid_busy_gpus, avoid_unhealthy_gpus, fallback_strategy")
NO_P2P = "remove it; NCCL already skips P2P where it does not work"
SYNTAX = "fix the syntax (indent with spaces, 'key: value')"

# (file text, message after "<path>:")
MALFORMED = {
    "unknown key": (
        "decision:\n  min_efficency: 0.5\n",
        "2: decision.min_efficency: unknown key; did you mean 'min_efficiency'? valid keys: "
        + DECISION_KEYS),
    "unknown section": (
        "decisions:\n  min_efficiency: 0.5\n",
        "1: decisions: unknown section; did you mean 'decision'? valid sections: decision, "
        "launch, dryrun, jobs, paths, slurm, enforce"),
    "bad indentation": (
        "decision:\n  min_efficiency: 0.5\n   trials: true\n",
        f"3: malformed YAML: mapping values are not allowed here; {SYNTAX}"),
    "tab indentation": (
        "decision:\n\tmin_efficiency: 0.5\n",
        f"2: malformed YAML: found character '\\t' that cannot start any token; {SYNTAX}"),
    "two documents": (
        "decision: {}\n---\nlaunch: {}\n",
        "2: malformed YAML: expected a single document in the stream but found another "
        f"document; {SYNTAX}"),
    "top level list": (
        "- decision\n",
        "1: expected a mapping of sections (decision, launch, dryrun, jobs, paths, slurm), got "
        "a list; write it as 'name: value' lines indented under it"),
    "section is a number": (
        "decision: 3\n",
        "1: decision: expected a mapping of decision keys, got int 3; write it as 'name: value' "
        "lines indented under it"),
    "number given a word": (
        "decision:\n  min_efficiency: high\n",
        "2: decision.min_efficiency: expected a number, got str 'high'; write a number, e.g. 0.7"),
    "number given a boolean": (
        "decision:\n  min_efficiency: true\n",
        "2: decision.min_efficiency: expected a number, got boolean true; write a number, "
        "e.g. 0.7"),
    "number given a list": (
        "decision:\n  min_efficiency: [0.7]\n",
        "2: decision.min_efficiency: expected a number, got a list"),
    "integer given a fraction": (
        "decision:\n  trial_steps: 2.5\n",
        "2: decision.trial_steps: expected an integer, got float 2.5; write an integer, e.g. 20"),
    "boolean given a quoted word": (
        'decision:\n  trials: "yes"\n',
        "2: decision.trials: expected true or false, got str 'yes'; write true or false"),
    "string given a number": (
        "paths:\n  cache_dir: 3\n",
        "2: paths.cache_dir: expected a string, got int 3; quote it"),
    "empty string": (
        'paths:\n  cache_dir: ""\n',
        "2: paths.cache_dir: must not be empty; remove the key to keep the default"),
    "not a number": (
        "decision:\n  min_efficiency: .nan\n",
        "2: decision.min_efficiency: nan is not a finite number; write a number, e.g. 0.7"),
    "efficiency above 1": (
        "decision:\n  min_efficiency: 1.5\n",
        "2: decision.min_efficiency: 1.5 is out of range; use a value from 0 to 1"),
    "zero memory headroom": (
        "decision:\n  memory_headroom: 0\n",
        "2: decision.memory_headroom: 0 is out of range; use a value above 0 and at most 1"),
    "zero GPUs": (
        "decision:\n  max_gpus: 0\n",
        "2: decision.max_gpus: 0 is out of range; use a value from 1 to 1024, or null for every "
        "visible GPU"),
    "negative timeout": (
        "launch:\n  rank_failure_timeout_s: 1\n  hang_timeout_s: -1\n",
        "3: launch.hang_timeout_s: -1 is out of range; use a value above 0 and at most 604800"),
    "unknown strategy": (
        "decision:\n  fallback_strategy: fast\n",
        "2: decision.fallback_strategy: 'fast' is not a strategy; use one of: single, "
        "independent, ddp"),
    "misspelt strategy in a list": (
        "decision:\n  allowed_strategies: [single, dpp]\n",
        "2: decision.allowed_strategies[1]: 'dpp' is not a strategy; did you mean 'ddp'? use one "
        "of: single, independent, ddp"),
    "list given a word": (
        "decision:\n  allowed_strategies: ddp\n",
        "2: decision.allowed_strategies: expected a list such as [single, ddp], got str 'ddp'"),
    "empty list": (
        "decision:\n  allowed_strategies: []\n",
        "2: decision.allowed_strategies: must list at least one strategy"),
    "repeated list item": (
        "decision:\n  allowed_strategies:\n    - single\n    - ddp\n    - single\n",
        "5: decision.allowed_strategies[2]: 'single' is listed twice; remove the repeat"),
    "world size not an integer": (
        "decision:\n  world_sizes: [1, 2, four]\n",
        "2: decision.world_sizes[2]: expected an integer, got str 'four'"),
    "world sizes given a number": (
        "decision:\n  world_sizes: 4\n",
        "2: decision.world_sizes: expected a list of integers such as [1, 2, 4, 8], got int 4"),
    "world size out of range": (
        "decision:\n  world_sizes: [0, 2]\n",
        "2: decision.world_sizes[0]: 0 is out of range; use a value from 1 to 1024"),
    "repeated world size": (
        "decision:\n  world_sizes: [2, 4, 2]\n",
        "2: decision.world_sizes[2]: 2 is listed twice; remove the repeat"),
    "empty world sizes": (
        "decision:\n  world_sizes: []\n",
        "2: decision.world_sizes: must list at least one integer, e.g. [1, 2, 4, 8]"),
    "unknown link family in a list": (
        "decision:\n  ddp_link_classes: [NV, PIX, SYSTEM]\n",
        "2: decision.ddp_link_classes[2]: 'SYSTEM' is not a link family; did you mean 'SYS'? use "
        "one of: NV, PIX, PXB, PHB, NODE, SYS"),
    "unknown NUMA mode": (
        "launch:\n  numa_binding: bind\n",
        "2: launch.numa_binding: 'bind' is not a NUMA mode; use one of: off, node, "
        "exclusive-cores"),
    "unknown NCCL link family": (
        "launch:\n  nccl:\n    PHX:\n      NCCL_ALGO: Tree\n",
        "3: launch.nccl.PHX: unknown link family; did you mean 'PXB'? valid link families: NV, "
        "PIX, PXB, PHB, NODE, SYS"),
    "NCCL key without NCCL_": (
        "launch:\n  nccl:\n    PHB:\n      ALGO: Tree\n",
        "4: launch.nccl.PHB.ALGO: NCCL settings must be NCCL_* variables; did you mean "
        "'NCCL_ALGO'? put other variables under launch.env"),
    "NCCL value is a list": (
        "launch:\n  nccl:\n    PHB:\n      NCCL_ALGO: [Tree, Ring]\n",
        '4: launch.nccl.PHB.NCCL_ALGO: expected a string or integer, got a list; write one '
        'value, quoted, e.g. NCCL_ALGO: "1"'),
    "NCCL value is a boolean": (
        "launch:\n  nccl:\n    PHB:\n      NCCL_IB_DISABLE: true\n",
        '4: launch.nccl.PHB.NCCL_IB_DISABLE: expected a string or integer, got boolean true; '
        'write one value, quoted, e.g. NCCL_IB_DISABLE: "1"'),
    "P2P disabled on PIX": (
        "launch:\n  nccl:\n    PIX:\n      NCCL_P2P_DISABLE: 1\n",
        "4: launch.nccl.PIX.NCCL_P2P_DISABLE: NCCL_P2P_DISABLE=1 disables the working P2P path "
        f"of PIX links; {NO_P2P}"),
    "P2P level LOC on NVLink": (
        "launch:\n  nccl:\n    NV:\n      NCCL_P2P_LEVEL: LOC\n",
        "4: launch.nccl.NV.NCCL_P2P_LEVEL: NCCL_P2P_LEVEL=LOC disables the working P2P path of "
        f"NV links; {NO_P2P}"),
    "P2P level below PXB": (
        "launch:\n  nccl:\n    PXB:\n      NCCL_P2P_LEVEL: PIX\n",
        "4: launch.nccl.PXB.NCCL_P2P_LEVEL: NCCL_P2P_LEVEL=PIX disables the working P2P path of "
        f"PXB links; {NO_P2P}"),
    "legacy integer P2P level below PXB": (
        "launch:\n  nccl:\n    PXB:\n      NCCL_P2P_LEVEL: 1\n",
        "4: launch.nccl.PXB.NCCL_P2P_LEVEL: NCCL_P2P_LEVEL=1 disables the working P2P path of "
        f"PXB links; {NO_P2P}"),
    "unknown P2P level": (
        "launch:\n  nccl:\n    PXB:\n      NCCL_P2P_LEVEL: FAST\n",
        "4: launch.nccl.PXB.NCCL_P2P_LEVEL: 'FAST' is not an NCCL_P2P_LEVEL; use one of: LOC, "
        "NVL, PIX, PXB, PHB, SYS"),
    "P2P disabled for every link": (
        'launch:\n  env:\n    NCCL_P2P_DISABLE: "1"\n',
        "3: launch.env.NCCL_P2P_DISABLE: NCCL_P2P_DISABLE=1 disables the working P2P path of "
        f"NV/PIX/PXB links; {NO_P2P}"),
    "bad variable name": (
        "launch:\n  env:\n    MY-VAR: x\n",
        "3: launch.env.MY-VAR: not a valid environment variable name; use letters, digits and _"),
    "duplicate key": (
        "decision:\n  min_efficiency: 0.5\n  trials: false\n  min_efficiency: 0.6\n",
        "4: decision.min_efficiency: duplicate key (first set at line 2); keep only one"),
    "numeric key": (
        "decision:\n  1: 0.5\n",
        "2: decision: key '1' is not a name; keys are words such as min_efficiency (quote it if "
        "it really is a name)"),
    "python tag": (
        "decision:\n  min_efficiency: !!python/object:os.system 1\n",
        "2: YAML tag not allowed: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object:os.system'; write a plain value (policy files are read "
        "with safe loading)"),
    "misspelt enforce section": (
        "enforce:\n  decison:\n    max_gpus: 4\n",
        "2: enforce.decison: unknown section; did you mean 'decision'? valid sections: decision, "
        "launch, dryrun, jobs, paths, slurm"),
    "misspelt enforce key": (
        "enforce:\n  decision:\n    max_gpu: 4\n",
        "3: enforce.decision.max_gpu: unknown key; did you mean 'max_gpus'? valid keys: "
        + DECISION_KEYS),
    "enforce inside enforce": (
        "enforce:\n  enforce:\n    decision: {}\n",
        "2: enforce.enforce: unknown section; valid sections: decision, launch, dryrun, jobs, "
        "paths, slurm"),
    "out of range inside enforce": (
        "enforce:\n  decision:\n    max_gpus: -4\n",
        "3: enforce.decision.max_gpus: -4 is out of range; use a value from 1 to 1024, or null "
        "for every visible GPU"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_policy_gives_precise_message(name, tmp_path):
    text, message = MALFORMED[name]
    path = write(tmp_path, "bad policy.yaml", text)
    with pytest.raises(PolicyError) as err:
        validate_file(path)
    assert str(err.value) == f"{path}:{message}"
    assert err.value.exit_code == ExitCode.POLICY


def test_every_problem_of_a_file_is_named_in_file_order(tmp_path):
    # Each MALFORMED case's key is independent of the others: one file with several of them
    # gives each message, in line order, and a launch's one line counts the rest.
    text = ("decision:\n  min_efficency: 0.5\n  trials: maybe\n  allowed_strategies: [single, dpp]\n"
            "  trials: true\nlaunch:\n  nccl:\n    PIX: {ALGO: Tree, NCCL_P2P_DISABLE: 1}\n"
            "jobz: {}\n")
    path = write(tmp_path, "bad policy.yaml", text)
    with pytest.raises(PolicyProblems) as err:
        validate_file(path)
    lines = [p.split(": ", 2)[:2] for p in err.value.problems]
    assert lines == [[f"{path}:2", "decision.min_efficency"], [f"{path}:3", "decision.trials"],
                     [f"{path}:4", "decision.allowed_strategies[1]"],
                     [f"{path}:5", "decision.trials"], [f"{path}:8", "launch.nccl.PIX.ALGO"],
                     [f"{path}:8", "launch.nccl.PIX.NCCL_P2P_DISABLE"], [f"{path}:9", "jobz"]]
    assert str(err.value) == (err.value.problems[0] + " (and 6 more problems; `smartlaunch-node "
                              f"policy check '{path}'` lists them)")
    assert err.value.exit_code == ExitCode.POLICY


def test_at_least_25_malformed_cases():
    assert len(MALFORMED) >= 25


def test_enforce_in_a_user_file_is_refused(tmp_path):
    path = write(tmp_path, "user.yaml", "decision:\n  max_gpus: 2\nenforce:\n  decision:\n"
                                        "    max_gpus: 4\n")
    with pytest.raises(PolicyError) as err:
        read_policy_file(path, allow_enforce=False)
    assert str(err.value) == (
        f"{path}:3: enforce: only the admin policy /etc/smartlaunch/policy.yaml may enforce "
        "values; remove this section (ask your administrator to change the rule)")


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(PolicyError, match=r"policy file .*nope.yaml not found; check the path"):
        validate_file(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"decision:\n  fallback_strategy: caf\xe9\n")
    with pytest.raises(PolicyError, match=r"latin1.yaml: not UTF-8 text .*save it as UTF-8"):
        validate_file(str(bad))


def test_valid_file_keeps_types_and_lines(tmp_path):
    path = write(tmp_path, "ok.yaml", """\
        # comment
        decision:
          min_efficiency: 1          # an integer where a number is expected is fine
          allowed_strategies: [single, ddp]
          max_gpus: null
        launch:
          numa_binding: off          # YAML 1.1 would read this as false
          nccl:
            PHB: {NCCL_BUFFSIZE: 4194304, NCCL_ALGO: Ring}
            SYS:
          env: {NCCL_DEBUG: WARN}
        jobs:
        """)
    parsed = validate_file(path)
    assert parsed.values == {
        "decision.min_efficiency": 1.0, "decision.allowed_strategies": ("single", "ddp"),
        "decision.max_gpus": None, "launch.numa_binding": "off",
        "launch.nccl.PHB": {"NCCL_BUFFSIZE": "4194304", "NCCL_ALGO": "Ring"},
        "launch.nccl.SYS": {}, "launch.env.NCCL_DEBUG": "WARN",
    }
    assert isinstance(parsed.values["decision.min_efficiency"], float)
    assert parsed.lines["decision.allowed_strategies"] == 4
    assert parsed.lines["launch.nccl.PHB"] == 9


def test_p2p_settings_allowed_where_no_p2p_path_is_disabled(tmp_path):
    # The seeds' NCCL_P2P_DISABLE=1 on a host bridge: no working P2P path there to break.
    path = write(tmp_path, "phb.yaml", """\
        launch:
          nccl:
            PHB: {NCCL_P2P_DISABLE: "1"}
            PXB: {NCCL_P2P_LEVEL: PXB, NCCL_P2P_DISABLE: 0}
            PIX: {NCCL_P2P_LEVEL: 1}    # NCCL's legacy integer for PIX
            NV: {NCCL_P2P_LEVEL: NVL}
        """)
    assert validate_file(path).values["launch.nccl.PHB"] == {"NCCL_P2P_DISABLE": "1"}
