"""The child processes the annotation app starts and watches, importable without torch: pair making
(`app.py --generate-pairs N --progress-lines`, both ends of its line protocol), rounds (`app.py --train-round`) and
whether a recorded process still lives."""
