"""Linear and Embedding vs torch.nn.Linear / torch.nn.Embedding: values and gradients."""

import pytest
import torch

from scratchlm.nn import Embedding, Linear


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias: bool) -> None:
    ours = Linear(7, 5, bias=bias)
    ref = torch.nn.Linear(7, 5, bias=bias)
    ref.load_state_dict(ours.state_dict())  # same (out, in) layout, same names
    x = torch.randn(3, 4, 7, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = ours(x), ref(x_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-6, atol=1e-6)
    if bias:
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-6, atol=1e-6)


def test_linear_init_bound_matches_torch_default() -> None:
    # torch.nn.Linear: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(in), 1/sqrt(in)); check the range is used.
    lin = Linear(400, 300, bias=True)
    bound = 1 / 400 ** 0.5
    assert lin.weight.abs().max() <= bound
    assert lin.weight.abs().max() > 0.95 * bound  # fills the range (120k draws)
    torch.testing.assert_close(lin.weight.std(), torch.tensor(bound / 3 ** 0.5), rtol=0.02, atol=0)


def test_embedding_matches_torch() -> None:
    ours = Embedding(11, 6)
    ref = torch.nn.Embedding(11, 6)
    ref.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 11, (4, 9))
    y, y_ref = ours(ids), ref(ids)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "ids, match",
    [
        (torch.tensor([[0, 11]]), "id 11 >= vocab_size 11"),
        (torch.tensor([[-1, 2]]), "negative id -1"),
        (torch.tensor([[0.0, 1.0]]), "integer dtype"),
    ],
)
def test_embedding_bad_ids(ids: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Embedding(11, 6)(ids)
