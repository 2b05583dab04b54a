"""The table bench/gpu_check.py prints from its figures."""

from __future__ import annotations

from .common import SECTIONS


def print_table(results):
    print(f"\n# gpu_check on {results['device_name']} ({results['date']}), torch {results['torch']}")
    for name in SECTIONS:
        section = results["sections"].get(name)
        if section is None:
            continue
        print(f"\n## {name}: {section['status']}" + (f" ({section['reason']})" if "reason" in section else ""))
        if "error" in section:  # the section itself broke: its traceback is in the JSON
            print(section["error"])
            continue
        if section["status"] == "skip":
            continue
        if name == "correctness":
            print("| mode | dtype | loss rel err | grad rel err | decision mismatch | ok |")
            for r in section["modes"]:
                print(
                    f"| {r['mode']} | {r['dtype']} | {r['loss_rel_err']:.1e} | {r['grad_rel_err']:.1e} | "
                    f"{r['decision_mismatch_frac']:.1e} | {r['ok']} |"
                )
            p = section["grpo_vs_plain_ppo"]
            print(f"grpo vs plain PPO clip: loss {p['loss_rel_err']:.1e}, grad {p['grad_rel_err']:.1e}")
        elif name == "bounds":
            for r in section["rows"]:
                print(
                    f"{r['dtype']}: lower {r['lower_rel_err']:.1e}, upper {r['upper_rel_err']:.1e}, "
                    f"special values ok {r['special_ok']}"
                )
        elif name == "sync":
            print(
                "| mode | meta detector | meta, metrics on | CPU accelerator branches, metrics on | CUDA sync-debug | CUDA, metrics on |"
            )
            for r in section["modes"]:
                print(
                    f"| {r['mode']} | {'; '.join(r['meta_sites']) or 'none'} | {'; '.join(r['meta_metrics_sites']) or 'none'} | "
                    f"{'; '.join(r['metrics_sites']) or 'none'} | {r.get('cuda_sync_debug', 'n/a') or 'none'} | "
                    f"{r.get('cuda_sync_debug_metrics', 'n/a') or 'none'} |"
                )
        elif name == "graph":
            for r in section["modes"]:
                print(
                    f"{r['mode']}: "
                    + (
                        f"replay vs eager loss {r['loss_rel_err']:.0e}, grad {r['grad_rel_err']:.0e}"
                        if r["captured"]
                        else r["error"]
                    )
                )
        elif name == "speed":
            print(f"B x T = {section['size']}, {section['clock']}, median of {section['repeats']}")
            print("| mode | ms | x grpo | x plain | ms no metrics | x grpo | x plain | peak MiB | x grpo |")
            for r in section["modes"]:
                mem = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} | {r['peak_x_grpo']:.2f}"
                print(
                    f"| {r['mode']} | {r['ms']:.2f} | {r['x_grpo']:.2f} | {r['x_plain']:.2f} | "
                    f"{r['ms_no_metrics']:.2f} | {r['x_grpo_no_metrics']:.2f} | {r['x_plain_no_metrics']:.2f} | "
                    f"{mem if r['peak_mib'] is not None else 'n/a | n/a'} |"
                )
            for c in section["compiled"]:
                print("torch.compile", {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in c.items()})
        elif name == "slime":
            for r in section.get("modes", []):
                print(
                    f"{r['mode']}: loss rel err {r['loss_rel_err']:.1e}, grad rel err {r['grad_rel_err']:.1e}, ok {r['ok']}"
                )
