"""Removes from the kept fuzz corpus (tests/fuzz/corpus) every input that
holds a copy of real data: a run of WINDOW bytes found in a file under
$CK_SHARED_DATA (../shared/data). The real files seed each run from where
they are; the repository keeps only what the fuzzers made.
Usage: keep_clean.py CORPUS_DIR [SHARED_DIR]"""
import os
import sys

WINDOW = 256


def shared_blobs(shared):
    blobs = []
    for root, _, files in os.walk(shared):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                blobs.append(fh.read())
    return blobs


def holds_real_data(data, blobs):
    if len(data) < WINDOW:
        return False
    for at in range(0, len(data) - WINDOW + 1, WINDOW // 2):
        piece = data[at:at + WINDOW]
        if len(set(piece)) < 8:  # zeros, padding: in every file, no one's data
            continue
        if any(piece in b for b in blobs):
            return True
    return False


def main(corpus, shared):
    if not os.path.isdir(shared):
        return
    blobs = shared_blobs(shared)
    removed = 0
    for root, _, files in os.walk(corpus):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                if holds_real_data(fh.read(), blobs):
                    os.unlink(p)
                    removed += 1
    print(f"keep_clean: {removed} inputs holding real data removed from {corpus}")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else
         os.environ.get("CK_SHARED_DATA", os.path.join(here, "..", "..", "..", "shared", "data")))
