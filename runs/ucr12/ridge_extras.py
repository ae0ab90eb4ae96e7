"""Prototype (validation only): the ridge head with extra ridge-only features, joined with the
saved net heads of rounds 10/11 (split seeds 1/2). Usage: s41_ridge.py SEED NAME..."""
import json, sys, time
sys.path.insert(0, "benchmarks")
import numpy as np, torch
import ucr_tokens as U
from linattn.tsc.conv_tokens import ConvTokens, _conv
from linattn.tsc.competing import CompetingKernels
from linattn.tsc.conv_classifier import fit_scaling, RidgeHead, ridge_proba

def pooled_extras(ct, X, chunk_rows=None):
    """MPV, MIPV, LSPV of the global ConvTokens' conv outputs: (n, 3 * n_ppv)."""
    L = ct.length_
    idx = torch.arange(L, dtype=torch.float32)
    outs = []
    per_row = 84 * max(b.shape[1] for b in ct.biases_) * L
    chunk = max(1, (1 << 23) // per_row)
    for i in range(0, len(X), chunk):
        x = torch.from_numpy(X[i:i + chunk])
        parts = []
        for d, b in zip(ct.dilations_, ct.biases_):
            c = _conv(x, int(d))                       # (n, 84, L)
            z = c[:, :, None, :] - b[None, :, :, None]  # (n, 84, nb, L)
            a = z > 0
            cnt = a.sum(-1).float()
            den = cnt.clamp_min(1)
            mpv = torch.where(a, z, 0).sum(-1) / den
            mipv = torch.where(a, idx, 0).sum(-1) / den / L
            mipv = torch.where(cnt > 0, mipv, -1.0)
            lastzero = torch.cummax(torch.where(a, -1.0, idx), -1).values
            lspv = (idx - lastzero).amax(-1) / L
            parts.append(torch.stack([mpv, mipv, lspv], 1).flatten(1))
        outs.append(torch.cat(parts, 1).numpy())
    return np.concatenate(outs)

def run(seed, name, heads_dir):
    X, y, classes, tr, va, row = U._inner_data(name, seed)
    n = len(classes)
    t0 = time.perf_counter()
    g = ConvTokens(1, 10000, 9, random_state=0).fit(X[tr])
    Gtr, m, s = fit_scaling(g.transform(X[tr])[:, 0]); Gva = (g.transform(X[va])[:, 0] - m) / s
    h = CompetingKernels(64, random_state=0).fit(X[tr])
    Htr, m, s = fit_scaling(h.transform(X[tr])); Hva = (h.transform(X[va]) - m) / s
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    Etr, m, s = fit_scaling(pooled_extras(g, X[tr])); Eva = (pooled_extras(g, X[va]) - m) / s
    t_ex = time.perf_counter() - t0
    t0 = time.perf_counter()
    dtr = np.diff(X, axis=1).astype(np.float32)
    gd = ConvTokens(1, 5000, 0, random_state=0).fit(dtr[tr])
    Dtr, m, s = fit_scaling(gd.transform(dtr[tr])[:, 0]); Dva = (gd.transform(dtr[va])[:, 0] - m) / s
    t_d = time.perf_counter() - t0
    saved = np.load(f"{heads_dir}/{name}.npz")
    assert np.array_equal(saved["y"], y[va])
    res = {"n_ppv": Gtr.shape[1], "n_extra": Etr.shape[1], "n_diff": Dtr.shape[1],
           "t_base": round(t_base, 2), "t_extra": round(t_ex, 2), "t_diff": round(t_d, 2)}
    variants = {"ridge": (Gtr, Htr), "ridgeE": (Gtr, Htr, Etr), "ridgeD": (Gtr, Htr, Dtr),
                "ridgeED": (Gtr, Htr, Etr, Dtr)}
    vas = {"ridge": (Gva, Hva), "ridgeE": (Gva, Hva, Eva), "ridgeD": (Gva, Hva, Dva),
           "ridgeED": (Gva, Hva, Eva, Dva)}
    acc = {}
    for k, parts in variants.items():
        t0 = time.perf_counter()
        r = RidgeHead.fit(np.hstack(parts), y[tr])
        p = ridge_proba(r.decision_function(np.hstack(vas[k])), r.classes_, n, 5.0)
        res[f"t_fit_{k}"] = round(time.perf_counter() - t0, 2)
        if k == "ridge":
            res["ridge_vs_saved"] = float(np.abs(p - saved["ridge"]).max())
        acc[k] = float((p.argmax(1) == y[va]).mean())
        acc["long_" + k] = float(((p + saved["net"]) / 2).argmax(1).__eq__(y[va]).mean())
    acc["saved_long"] = float(((saved["ridge"] + saved["net"]) / 2).argmax(1).__eq__(y[va]).mean())
    res["accuracy"] = acc
    return res

if __name__ == "__main__":
    seed = int(sys.argv[1]); out = sys.argv[2]
    hd = {1: "runs/ucr_tokens/round10_{}_heads", 2: "runs/ucr_tokens/round11_{}_heads"}[seed]
    results = json.load(open(out)) if __import__("os").path.exists(out) else {}
    for name in sys.argv[3:]:
        if name in results:
            continue
        import os
        d = hd.format("A") if os.path.exists(hd.format("A") + f"/{name}.npz") else hd.format("B")
        results[name] = run(seed, name, d)
        print(name, json.dumps(results[name]), flush=True)
        tmp = out + ".tmp"; json.dump(results, open(tmp, "w"), indent=1); os.replace(tmp, out)
