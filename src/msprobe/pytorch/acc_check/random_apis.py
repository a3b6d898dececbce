"""APIs whose result depends on the random number generator. On the CPU both runs are seeded alike
and draw the same numbers; on an accelerator the generators differ, so these are skipped there."""

RANDOM_APIS = frozenset({
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "native_dropout", "fused_dropout", "rrelu", "rrelu_", "gumbel_softmax", "rand", "randn", "randint",
    "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_", "multinomial", "normal",
    "normal_", "poisson", "uniform_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
})
