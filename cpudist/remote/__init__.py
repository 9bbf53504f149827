"""Running a job from outside the cluster: stage inputs on the nodes, launch on the head, fetch results."""
