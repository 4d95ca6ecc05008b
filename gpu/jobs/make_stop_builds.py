"""Build decode_topk variants that stop after a phase, for gpu/jobs/topk_phases.sh (run on the build machine).

usage: python gpu/jobs/make_stop_builds.py [STOP ...]     (default: 9 1 2 3; writes .gl/stopN)

A temporary git worktree of HEAD gets a patched kernels/decode_topk/kernel.py (DecodeTopK:
its __init__ and kernel body; FP32 token variants only): stop 9 reads nothing (launch and
set-up), 1 stops after step 1, 2 after the first digit, 3 after the gather (no finish).
Each stop ends with a cluster barrier so no CTA leaves while a peer may still read its
shared memory. Every edit must find its anchor exactly once (else the kernel moved on:
update the anchor). The patched builds are measurements only; they never enter the cache.
"""
import os
import subprocess
import sys
import tempfile


def find(lines, text, start=0):
    return next(i for i in range(start, len(lines)) if text in lines[i])


def wrap(lines, lo, hi, cond):
    """lines[lo:hi] become the else branch of `if const_expr(cond): <cluster barrier>`."""
    pad = " " * (len(lines[lo]) - len(lines[lo].lstrip()))
    body = ["    " + line if line.strip() else line for line in lines[lo:hi]]
    head = [pad + f"if const_expr({cond}):", pad + "    cute.arch.cluster_arrive()",
            pad + "    cute.arch.cluster_wait()", pad + "else:"]
    return lines[:lo] + head + body + lines[hi:]


def replace_once(s: str, old: str, new: str) -> str:
    if s.count(old) != 1:
        raise SystemExit(f"make_stop_builds: {old.strip()[:70]!r} found {s.count(old)} times in the kernel")
    return s.replace(old, new)


def patch(src: str) -> str:
    # The edits inside the kernel body first, at its own indentation (an `if` two columns in keeps the
    # block under it valid), then the wraps of its later steps.
    s = replace_once(src, "        self.warp_min_groups = warp_min_groups\n",
                     "        self.warp_min_groups = warp_min_groups\n"
                     "        self.stop = int(__import__('os').environ.get('DECODE_TOPK_STOP', '0'))\n")
    s = replace_once(s, "            short = self.step1_by_tiles(g_hi - g_lo)\n",
                     "            if const_expr(self.stop == 9):\n                g_hi = g_lo\n"
                     "            short = self.step1_by_tiles(g_hi - g_lo)\n")
    s = replace_once(s, "                    if rank == 0:\n                        n_gathered = count0\n",
                     "                    if const_expr(self.stop != 3):\n                      if rank == 0:\n"
                     "                        n_gathered = count0\n")
    s = replace_once(s, "                self.mark(s_tl, 8)  # the cluster-wide finish instead (no 5-7)\n"
                        "                self.finish_clustered(",
                     "                self.mark(s_tl, 8)  # the cluster-wide finish instead (no 5-7)\n"
                     "                if const_expr(self.stop != 3):\n                  self.finish_clustered(")
    lines = s.split("\n")
    begin = find(lines, "    def kernel(self, logits")
    end = find(lines, "    @cute.jit", begin)
    after_step1 = find(lines, "list_len = Int32(sel(ok != 0", begin) + 1
    after_digit = find(lines, "krem = k - above0", begin)
    lines = wrap(lines, after_digit, end - 1, "self.stop == 2")
    lines = wrap(lines, after_step1, end - 1 + 4, "self.stop in (1, 9)")
    return "\n".join(lines)


def main() -> None:
    stops = sys.argv[1:] or ["9", "1", "2", "3"]
    repo = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        subprocess.check_call(["git", "worktree", "add", "-q", "--detach", tree, "HEAD"], cwd=repo)
        try:
            kernel = os.path.join(tree, "kernels", "decode_topk", "kernel.py")
            with open(kernel) as f:
                src = patch(f.read())
            with open(kernel, "w") as f:
                f.write(src)
            contract = os.path.join(tree, "runtime", "contract", "decode_topk.py")
            with open(contract) as f:
                c = f.read().replace("    for dtype in DTYPES\n    for block_mode in (False, True)",
                                     "    for dtype in ('f32',)\n    for block_mode in (False,)")
            with open(contract, "w") as f:
                f.write(c)
            for stop in stops:
                out = os.path.join(repo, ".gl", f"stop{stop}")
                env = dict(os.environ, DECODE_TOPK_STOP=stop)
                subprocess.check_call([sys.executable, "build_kernels.py", "--arch", "sm_90a", "--only", "decode_topk",
                                       "--jobs", "2", "--out", out], cwd=tree, env=env, stdout=subprocess.DEVNULL)
                print("built", out)
        finally:
            subprocess.call(["git", "worktree", "remove", "--force", tree], cwd=repo)


if __name__ == "__main__":
    main()
