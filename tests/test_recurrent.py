"""The numpy recurrent cells against torch's GRUCell / LSTMCell, step by step and over long sequences (errors
would compound), with episode resets; and the weight layout checks."""
import numpy as np
import pytest
import torch

from laglab.recurrent import Cell, reset_where, state_shape, zero_state


def torch_cell(kind, n_in, hidden, seed):
    torch.manual_seed(seed)
    cell = (torch.nn.GRUCell if kind == "gru" else torch.nn.LSTMCell)(n_in, hidden)
    with torch.no_grad():
        for p in cell.parameters():
            p.mul_(3.0)  # weights large enough to saturate some gates (both branches of the sigmoid)
    return cell, {k: v.detach().numpy() for k, v in cell.state_dict().items()}


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_numpy_cells_follow_torch_over_200_steps_with_resets(kind):
    n_in, H, B, T = 5, 16, 7, 200
    cell, weights = torch_cell(kind, n_in, H, 0)
    ours = Cell(kind, weights)
    rng = np.random.default_rng(1)
    xs = rng.normal(0, 2, (T, B, n_in)).astype(np.float32)
    done = rng.random((T, B)) < 0.05
    s = zero_state(kind, H, B)
    h_t = torch.zeros(B, H, dtype=torch.float64)
    c_t = torch.zeros(B, H, dtype=torch.float64)
    cell64 = cell.double()
    worst = 0.0
    with torch.no_grad():
        for t in range(T):
            x = torch.from_numpy(xs[t]).double()
            if kind == "gru":
                h_t = cell64(x, h_t)
                want = h_t.numpy()
            else:
                h_t, c_t = cell64(x, (h_t, c_t))
                want = np.stack([h_t.numpy(), c_t.numpy()], axis=1)
            s = ours.step(xs[t], s)
            assert s.shape == (B,) + state_shape(kind, H) and s.dtype == np.float32
            worst = max(worst, float(np.abs(s - want).max()))
            s = reset_where(s, done[t])
            keep = torch.from_numpy(~done[t]).double()[:, None]
            h_t, c_t = h_t * keep, c_t * keep
            assert (s[done[t]] == 0).all()
    assert worst < 1e-5, worst  # float32 arithmetic against a float64 reference, after 200 steps
    np.testing.assert_array_equal(Cell.output(kind, s), s if kind == "gru" else s[:, 0])


def test_one_float32_step_matches_torchs_float32_step_to_1e_6():
    for kind in ("gru", "lstm"):
        cell, weights = torch_cell(kind, 4, 8, 2)
        rng = np.random.default_rng(3)
        x = rng.normal(size=(32, 4)).astype(np.float32)
        h = rng.normal(size=(32, 8)).astype(np.float32)
        c = rng.normal(size=(32, 8)).astype(np.float32)
        with torch.no_grad():
            if kind == "gru":
                want = cell(torch.from_numpy(x), torch.from_numpy(h)).numpy()
                got = Cell(kind, weights).step(x, h)
            else:
                h2, c2 = cell(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))
                want = np.stack([h2.numpy(), c2.numpy()], axis=1)
                got = Cell(kind, weights).step(x, np.stack([h, c], axis=1))
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_weights_of_the_wrong_layout_and_unknown_kinds_are_refused():
    _, gru = torch_cell("gru", 4, 8, 0)
    with pytest.raises(ValueError, match="not 4 gates of 8"):
        Cell("lstm", gru)
    with pytest.raises(ValueError, match="allowed: gru, lstm"):
        Cell("rnn", gru)
    with pytest.raises(ValueError, match="allowed: gru, lstm"):
        state_shape("transformer", 8)
