"""The numbers behind the explore pages (Home, Sinusoidal & learned, RoPE, Attention biases, About):
what each position method adds, rotates or biases, drawn from the method interface and the checkpoints'
learned parameters. Pure functions: no plotting, no Streamlit."""
