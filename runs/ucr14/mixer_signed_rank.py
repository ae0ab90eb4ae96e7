"""Issue 27: how sure is the mixer's small TEST gain? Per dataset, the fifth configuration's
accuracy with and without the mixer averaged over the three TEST seeds
(runs/ucr13/test/seed{0,1,2}.json, no new fit), their wins/ties/losses (a difference above
0.0005 counts) and the Wilcoxon signed-rank test over the 50 sets."""
import json

import numpy as np
from scipy.stats import wilcoxon

rows = [json.load(open(f"runs/ucr13/test/seed{s}.json"))["datasets"] for s in range(3)]
names = sorted(rows[0])
with_mixer = np.array([[r[n]["linattn"]["accuracy"] for r in rows] for n in names]).mean(1)
without = np.array([[r[n]["linattn"]["no_mixer"]["accuracy"] for r in rows]
                    for n in names]).mean(1)
d = with_mixer - without
print(f"{len(names)} sets: with the mixer {with_mixer.mean():.4f}, without {without.mean():.4f}, "
      f"difference {100 * d.mean():+.2f} points")
print(f"W/T/L {(d > 5e-4).sum()}/{(abs(d) <= 5e-4).sum()}/{(d < -5e-4).sum()}; "
      f"Wilcoxon signed-rank p = {wilcoxon(with_mixer, without).pvalue:.3f}")
