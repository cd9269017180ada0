"""skalpel inside the loops people already use: a Lightning callback (``lightning.py``) and a Hugging Face
``TrainerCallback`` (``hf.py``), both driving one ``skalpel.profile()`` session (``training.py``).

Each is imported only when used, with its framework (the ``[lightning]`` and ``[hf]`` extras).
"""
