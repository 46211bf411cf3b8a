#!/usr/bin/env python3
"""The coefficients of infer/internal.h's ck_infer_erff, and their error.

|x| < SPLIT: erf(x) = x P(x^2), P of degree DA; SPLIT <= |x| <= 4:
erf(x) = 1 - e^(-x^2) R(|x| - SHIFT), R of degree DB (erfc(x) e^(x^2) is
smooth there). Each is fitted to erf in double by least squares weighted by
the relative error, reweighted towards the minimax (Lawson), then rounded to
float32; the script evaluates the result as the C code does (float32 Horner
steps, e^ rounded to float32) against math.erf and prints the worst error in
ulp. Usage: scripts/erf_fit.py [DA DB SPLIT SHIFT] (ckptd's: 6 10 1.0 2.5).
The engine's own test (test_infer.c erf_within_four_ulp_of_libm) checks the
C code against libm's erff.
"""
import math
import sys

import numpy as np


def fit(xs, ys, deg, shift=0.0):
    w = 1 / np.abs(ys)
    lw = np.ones_like(xs)
    u = xs - shift
    for _ in range(40):
        v = np.vander(u, deg + 1, increasing=True)
        c, *_ = np.linalg.lstsq(v * (w * np.sqrt(lw))[:, None], ys * w * np.sqrt(lw), rcond=None)
        e = np.abs(v @ c - ys) * w
        lw = lw * (e / e.max() + 1e-4)
        lw /= lw.sum()
    return c, e.max()


def main():
    da, db, split, shift = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]),
                            float(sys.argv[4])) if len(sys.argv) == 5 else (6, 10, 1.0, 2.5)
    xa = np.linspace(0, split, 20001)
    fa = np.array([math.erf(v) / v if v else 2 / math.sqrt(math.pi) for v in xa])
    ca, ea = fit(xa * xa, fa, da)
    xb = np.linspace(split, 4.0, 20001)
    fb = np.array([math.erfc(v) * math.exp(v * v) for v in xb])
    cb, eb = fit(xb, fb, db, shift)
    a32, b32, f32 = ca.astype(np.float32), cb.astype(np.float32), np.float32
    xs = np.linspace(-5, 5, 2000001).astype(np.float32)
    a = np.minimum(np.abs(xs), f32(4.0))
    t = a * a
    p = a32[da]
    for k in range(da - 1, -1, -1):
        p = p * t + a32[k]
    r = b32[db]
    u = a - f32(shift)
    for k in range(db - 1, -1, -1):
        r = r * u + b32[k]
    big = f32(1.0) - np.exp(-t.astype(np.float64)).astype(np.float32) * r
    got = np.copysign(np.where(a < f32(split), a * p, big), xs).astype(np.float64)
    want = np.array([math.erf(float(v)) for v in xs])
    w32 = np.abs(want.astype(np.float32))
    ulp = (w32 - np.nextafter(w32, np.float32(0))).astype(np.float64)
    ulp[ulp == 0] = np.finfo(np.float32).smallest_subnormal
    err = np.abs(got - want) / ulp
    print("fit in double: relative error %.3g (P), %.3g (R)" % (ea, eb))
    print("float32: worst %.2f ulp at %.9g" % (err.max(), xs[err.argmax()]))
    print("P (t^0 first):", ", ".join("%.9ef" % v for v in a32))
    print("R (u^0 first):", ", ".join("%.9ef" % v for v in b32))


if __name__ == "__main__":
    main()
