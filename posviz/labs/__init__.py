"""The numbers behind the live labs, one module per lab, and what they share (the text they run on,
attention maps, the far-context probes). Pure functions over ``posviz.models.interface.LabModel``:
no plotting, no Streamlit, and no question of which kind of model or text they hold."""
