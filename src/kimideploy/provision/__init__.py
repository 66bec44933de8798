"""The Ansible boundary: inventories from kimideploy.yaml, playbook runs and their recap."""
