"""The max-token probe: the largest N_tokens that fits, found by a ramp then bisection."""
