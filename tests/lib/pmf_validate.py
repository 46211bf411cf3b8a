"""An independent PMF validator for the tests, written from the reference
validator's rules (../shared/specs/FORMAT-FACTS.md section 1), reading YAML
with PyYAML's safe_load exactly as the reference does. ckptd's C parser is
never used here, so a bug in it cannot hide a bug in what ckptd writes.

    python3 pmf_validate.py TREE      exits 0 when TREE passes strict validation
"""
import hashlib
import os
import re
import sys

import yaml

MD5 = re.compile(r"^[a-f0-9]{32}$")
PRODUCER = re.compile(r"^[a-zA-Z][0-9a-zA-Z_]+$")


class Invalid(ValueError):
    pass


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _exact(d, keys, where):
    if not isinstance(d, dict):
        raise Invalid(f"{where}: expected a mapping, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    extra = [k for k in d if k not in keys]
    if missing:
        raise Invalid(f"{where}: missing key(s) {missing}")
    if extra:
        raise Invalid(f"{where}: extra key(s) {extra}")


def _str(v, where, nullable=False):
    if v is None and nullable:
        return
    if not isinstance(v, str):
        raise Invalid(f"{where}: expected a string, got {v!r}")


def _path(v, where):
    _str(v, where)
    if not v or "\0" in v:
        raise Invalid(f"{where}: not a path: {v!r}")


def _md5(v, where):
    if not isinstance(v, str) or not MD5.match(v):
        raise Invalid(f"{where}: not a lower-case md5: {v!r}")


def _ref(v, where):
    if not (isinstance(v, str) or _is_int(v)):
        raise Invalid(f"{where}: a reference must be str or int, got {v!r}")


def validate_metadata(meta):
    _exact(meta, ["format", "model"], "top level")
    fmt = meta["format"]
    _exact(fmt, ["version", "producer"], "format")
    if fmt["version"] != "1.0.0" or not isinstance(fmt["version"], str):
        raise Invalid(f"format.version must be '1.0.0', got {fmt['version']!r}")
    prod = fmt["producer"]
    _exact(prod, ["name", "version"], "format.producer")
    _str(prod["name"], "format.producer.name")
    if not PRODUCER.match(prod["name"]):
        raise Invalid(f"format.producer.name {prod['name']!r} does not match {PRODUCER.pattern}")
    _exact(prod["version"], ["format", "value"], "format.producer.version")
    _str(prod["version"]["format"], "format.producer.version.format")
    _str(prod["version"]["value"], "format.producer.version.value")

    model = meta["model"]
    _exact(model, ["name", "id", "configuration", "initialisation", "training"], "model")
    _str(model["name"], "model.name", nullable=True)
    _str(model["id"], "model.id")
    conf = model["configuration"]
    _exact(conf, ["path", "hash"], "model.configuration")
    _path(conf["path"], "model.configuration.path")
    _md5(conf["hash"], "model.configuration.hash")

    init = model["initialisation"]
    if init is not None:
        if not isinstance(init, dict) or len(init) != 1 or list(init)[0] not in ("file", "pmf"):
            raise Invalid(f"model.initialisation: expected null, file or pmf: {init!r}")
        if "file" in init:
            f = init["file"]
            _exact(f, ["name", "path", "hash"], "initialisation.file")
            _str(f["name"], "initialisation.file.name", nullable=True)
            _path(f["path"], "initialisation.file.path")
            _md5(f["hash"], "initialisation.file.hash")
        else:
            p = init["pmf"]
            _exact(p, ["name", "id", "path", "checkpoint"], "initialisation.pmf")
            _str(p["name"], "initialisation.pmf.name", nullable=True)
            _str(p["id"], "initialisation.pmf.id")
            _path(p["path"], "initialisation.pmf.path")
            _ref(p["checkpoint"], "initialisation.pmf.checkpoint")

    t = model["training"]
    _exact(t, ["status", "start_time", "latest_time", "end_time", "start_epoch",
               "latest_epoch", "end_epoch", "latest", "checkpoints"], "model.training")
    if t["status"] not in ("pending", "running", "finished", "failed"):
        raise Invalid(f"training.status {t['status']!r}")
    for k in ("start_time", "latest_time", "end_time"):
        if t[k] is not None and not _is_num(t[k]):
            raise Invalid(f"training.{k} must be a number or null: {t[k]!r}")
    for k in ("start_epoch", "latest_epoch", "end_epoch"):
        if t[k] is not None and not _is_int(t[k]):
            raise Invalid(f"training.{k} must be an int or null: {t[k]!r}")
    if t["latest"] is not None:
        _ref(t["latest"], "training.latest")
    ckpts = t["checkpoints"]
    if not isinstance(ckpts, dict):
        raise Invalid(f"training.checkpoints must be a mapping ({{}} when empty): {ckpts!r}")
    for ref, c in ckpts.items():
        _ref(ref, "checkpoint reference")
        _exact(c, ["epoch", "path", "hash"], f"checkpoint {ref!r}")
        if not _is_int(c["epoch"]):
            raise Invalid(f"checkpoint {ref!r}: epoch must be an int: {c['epoch']!r}")
        _path(c["path"], f"checkpoint {ref!r} path")
        _md5(c["hash"], f"checkpoint {ref!r} hash")

    # Training.validate's cross rules
    st, lt, et = t["start_time"], t["latest_time"], t["end_time"]
    se, le, ee = t["start_epoch"], t["latest_epoch"], t["end_epoch"]
    if et is not None and (st is None or lt is None):
        raise Invalid("end_time needs start_time and latest_time")
    if lt is not None and st is None:
        raise Invalid("latest_time needs start_time")
    if st is not None and lt is not None and st > lt:
        raise Invalid("start_time > latest_time")
    if lt is not None and et is not None and lt > et:
        raise Invalid("latest_time > end_time")
    if ee is not None and (se is None or le is None):
        raise Invalid("end_epoch needs start_epoch and latest_epoch")
    if le is not None and se is None:
        raise Invalid("latest_epoch needs start_epoch")
    if se is not None and le is not None and se > le:
        raise Invalid("start_epoch > latest_epoch")
    if le is not None and ee is not None and le > ee:
        raise Invalid("latest_epoch > end_epoch")
    for e, tm, name in ((se, st, "start"), (le, lt, "latest"), (ee, et, "end")):
        if (e is None) != (tm is None):
            raise Invalid(f"{name}_epoch and {name}_time must be set together")
    if t["status"] == "pending" and any(v is not None for v in (st, lt, et, se, le, ee)):
        raise Invalid("pending forbids start, latest and end values")
    if t["status"] == "running" and (et is not None or ee is not None):
        raise Invalid("running forbids end values")
    if ckpts and t["latest"] not in ckpts:
        raise Invalid(f"latest {t['latest']!r} is not a checkpoint reference")
    if le is not None:
        for ref, c in ckpts.items():
            if c["epoch"] > le:
                raise Invalid(f"checkpoint {ref!r} epoch {c['epoch']} > latest_epoch {le}")


def md5_file(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(65536), b""):
            h.update(block)
    return h.hexdigest()


def load_metadata(root):
    with open(os.path.join(root, "metadata.yaml"), "rb") as f:
        return yaml.safe_load(f)


def validate_tree(root, strict=True, require_checkpoints=True):
    """Raises Invalid when root is not a valid PMF tree; returns the metadata."""
    if not os.path.isfile(os.path.join(root, "metadata.yaml")):
        raise Invalid("missing metadata.yaml")
    meta = load_metadata(root)
    validate_metadata(meta)
    model = meta["model"]
    top = set(os.listdir(root))
    conf = model["configuration"]["path"]
    if conf not in top or not os.path.isfile(os.path.join(root, conf)):
        raise Invalid(f"no configuration file found: {conf!r} is not a top-level file")
    data = os.path.join(root, "data")
    if not os.path.isfile(os.path.join(data, "build_parameters.yaml")):
        raise Invalid("Missing key: data/build_parameters.yaml")
    if not os.path.isdir(os.path.join(data, "initialisation")):
        raise Invalid("Missing key: data/initialisation/")
    ckdir = os.path.join(data, "checkpoints")
    if require_checkpoints and not os.path.isdir(ckdir):
        raise Invalid("Missing key: data/checkpoints/")
    present = set(os.listdir(ckdir)) if os.path.isdir(ckdir) else set()
    checked = model["training"]["checkpoints"].items() if os.path.isdir(ckdir) else []
    for ref, c in checked:
        base = os.path.basename(c["path"])
        if base not in present:
            raise Invalid(f"checkpoint {ref!r}: {base!r} not in data/checkpoints")
        if strict and md5_file(os.path.join(ckdir, base)) != c["hash"]:
            raise Invalid(f"checkpoints file checksum mismatch for {ref!r}")
    init = model["initialisation"]
    initdir = os.path.join(data, "initialisation")
    if init is not None and "file" in init:
        names = os.listdir(initdir)
        if "metadata.yaml" in names:
            raise Invalid("file initialisation but data/initialisation holds metadata.yaml")
        base = os.path.basename(init["file"]["path"])
        if base not in names:
            raise Invalid(f"initialisation file {base!r} missing")
        if strict and md5_file(os.path.join(initdir, base)) != init["file"]["hash"]:
            raise Invalid("initialisation file checksum mismatch")
    if init is not None and "pmf" in init:
        sub = validate_tree(initdir, strict=strict, require_checkpoints=False)
        if init["pmf"]["checkpoint"] not in sub["model"]["training"]["checkpoints"]:
            raise Invalid("initialisation checkpoint is not in the initialisation tree")
    if strict and md5_file(os.path.join(root, conf)) != model["configuration"]["hash"]:
        raise Invalid("configuration file checksum mismatch")
    return meta


if __name__ == "__main__":
    try:
        validate_tree(sys.argv[1])
    except Invalid as e:
        print(f"invalid: {e}", file=sys.stderr)
        sys.exit(1)
    print("valid")
