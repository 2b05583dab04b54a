"""`epic-slime study`: the paper's claims tested at toy scale (a reasoning-like task, the Table 1
methods and the EPIC ablations paired by seed, validation/test selection, diagnostics, figures)."""
