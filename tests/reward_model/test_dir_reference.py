"""DIR defaults against a torch simulation of the reference trainer's data-parallel step (issue 15 item 5).

The oracle follows the reference's semantics (Qwen-Applications/DIR `reward_models/debias_trainer_length.py`,
`scripts/train_debias_rm.sh`; spec section 5, FIDELITY §6), written from the spec, not copied: W ranks hold
one pair each per micro-step; per micro-step the W pairs' x are gathered, the classifier takes 5 torch AdamW
steps (default weight decay 0.01) on them, then every rank adds debias_factor·Î(gathered x) to its local BT
loss, where the gather's backward keeps only the rank's own slice; gradients are averaged over the W ranks
(DDP) and accumulated over M micro-steps (each loss divided by M). jaxrl's step with its *defaults* (γ, weight
decay, inner steps) and `micro_batches=M` must give the same classifier and the same gradient w.r.t. the RM's
head outputs (r^c, r^r, x), hence the same RM update.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.losses import dir as dir_lib
from jaxrl.reward_model.config import DebiasConfig
from jaxrl.reward_model.train import classifier_optimizer, init_classifier, rm_objective

torch = pytest.importorskip("torch")

W, M, D, HIDDEN, LR = 8, 2, 6, 16, 1e-2   # lr 1e-2 makes weight decay 0.01 visible over 10 steps


def _torch_classifier(clf):
    net = torch.nn.Sequential(torch.nn.Linear(D, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 2))
    net = net.double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(np.asarray(clf["w1_DF"]).T))
        net[0].bias.copy_(torch.tensor(np.asarray(clf["b1_F"])))
        net[2].weight.copy_(torch.tensor(np.asarray(clf["w2_FC"]).T))
        net[2].bias.copy_(torch.tensor(np.asarray(clf["b2_C"])))
    return net


def _club(net, x, a):
    """Î = mean_i log q(a_i|x_i) − mean_{i,j} log q(a_j|x_i), the O(N²) form."""
    logq = torch.log_softmax(net(x), -1)
    return logq[torch.arange(len(a)), a].mean() - logq[:, a].mean()


def _reference_step(clf, r_c, r_r, x, a, debias_factor=1.0, inner=5):
    net = _torch_classifier(clf)
    opt = torch.optim.AdamW(net.parameters(), lr=LR)  # torch defaults: weight_decay=0.01, eps=1e-8
    g_rc, g_rr, g_x = (np.zeros(v.shape) for v in (r_c, r_r, x))
    for m in range(M):
        rows = slice(m * W, (m + 1) * W)
        xm, am = torch.tensor(x[rows]), torch.tensor(a[rows], dtype=torch.long)
        for _ in range(inner):
            opt.zero_grad()
            (-torch.log_softmax(net(xm), -1)[torch.arange(W), am].mean()).backward()
            opt.step()
        for k in range(W):  # rank k
            rc = torch.tensor(r_c[rows][k:k + 1], requires_grad=True)
            rr = torch.tensor(r_r[rows][k:k + 1], requires_grad=True)
            xk = torch.tensor(x[rows][k:k + 1], requires_grad=True)
            gathered = torch.cat([xm[:k], xk, xm[k + 1:]])  # other ranks' slices carry no gradient here
            bt = torch.nn.functional.softplus(-(rc - rr)).mean()
            loss = (bt + debias_factor * _club(net, gathered, am)) / M   # grad accumulation over M
            net.zero_grad()
            loss.backward()
            i = m * W + k
            # DDP averages the ranks' gradients
            g_rc[i], g_rr[i], g_x[i] = rc.grad.item() / W, rr.grad.item() / W, xk.grad.numpy()[0] / W
    params = [p.detach().numpy() for p in net.parameters()]
    return (g_rc, g_rr, g_x), params


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2, size=W * M)
    x = rng.normal(size=(W * M, D)) + 0.8 * a[:, None]
    return rng.normal(size=W * M), rng.normal(size=W * M), x, a


def test_defaults_reproduce_the_reference_data_parallel_step():
    debias = DebiasConfig(enabled=True, micro_batches=M, classifier_lr=LR, hidden_dim=HIDDEN)
    assert debias.gamma == dir_lib.reference_gamma(1.0, W) == 0.125 and debias.inner_steps == 5
    clf, clf_opt = init_classifier(debias, D, jax.random.key(0))
    r_c, r_r, x, a = _inputs()
    (ref_rc, ref_rr, ref_x), ref_params = _reference_step(clf, r_c, r_r, x, a)

    f32 = lambda v: jnp.asarray(v, jnp.float32)
    stacked, final, _, _ = dir_lib.classifier_micro_steps(clf, clf_opt, f32(x), jnp.asarray(a),
                                                          classifier_optimizer(debias), debias.inner_steps, M)
    got = [final["w1_DF"].T, final["b1_F"], final["w2_FC"].T, final["b2_C"]]
    for g, want in zip(got, ref_params):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
    grads = jax.grad(lambda rc, rr, xx: rm_objective(rc, rr, xx, jnp.asarray(a), stacked, gamma=debias.gamma,
                                                     debias=True, stacked=True)[0], argnums=(0, 1, 2))(
        f32(r_c), f32(r_r), f32(x))
    for g, want in zip(grads, (ref_rc, ref_rr, ref_x)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-7)


def test_weight_decay_is_torchs_default_and_visible():
    """The default classifier optimiser equals torch AdamW(lr); without decay the params differ measurably."""
    debias = DebiasConfig(enabled=True, classifier_lr=LR, hidden_dim=HIDDEN)
    assert debias.classifier_weight_decay == 0.01
    clf, _ = init_classifier(debias, D, jax.random.key(1))
    _, _, x, a = _inputs(1)
    x, a = x[:W], a[:W]
    net = _torch_classifier(clf)
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    for _ in range(20):
        opt.zero_grad()
        (-torch.log_softmax(net(torch.tensor(x)), -1)[torch.arange(W), torch.tensor(a)].mean()).backward()
        opt.step()
    want = net[0].weight.detach().numpy().T
    for wd, close in [(0.01, True), (0.0, False)]:
        cfg = DebiasConfig(enabled=True, classifier_lr=LR, hidden_dim=HIDDEN, classifier_weight_decay=wd)
        opt_j = classifier_optimizer(cfg)
        p, _, _ = dir_lib.classifier_inner_steps(clf, opt_j.init(clf), jnp.asarray(x, jnp.float32),
                                                 jnp.asarray(a), opt_j, 20)
        err = np.max(np.abs(np.asarray(p["w1_DF"]) - want))
        assert (err < 2e-6) == close, (wd, err)


def test_gamma_one_is_eight_times_the_reference_pressure():
    """The old default γ=1 applied debias_factor=1 without the 1/W of the data-parallel average."""
    debias = DebiasConfig(enabled=True, micro_batches=M, classifier_lr=LR, hidden_dim=HIDDEN)
    clf, clf_opt = init_classifier(debias, D, jax.random.key(0))
    r_c, r_r, x, a = _inputs()
    (_, _, ref_x), _ = _reference_step(clf, r_c, r_r, x, a)
    stacked, *_ = dir_lib.classifier_micro_steps(clf, clf_opt, jnp.asarray(x, jnp.float32), jnp.asarray(a),
                                                 classifier_optimizer(debias), 5, M)
    g_x = jax.grad(lambda xx: rm_objective(jnp.asarray(r_c, jnp.float32), jnp.asarray(r_r, jnp.float32), xx,
                                           jnp.asarray(a), stacked, gamma=1.0, debias=True, stacked=True)[0])(
        jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(g_x, W * ref_x, rtol=1e-4, atol=1e-7)
